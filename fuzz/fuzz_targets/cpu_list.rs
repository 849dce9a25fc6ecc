//! runtime-hooks' kernel CPU list parser (`cgroup::parse_cpu_list`, what `cpuset.cpus` and hook
//! answers hold): never panics, is cheap on long overlapping lists, only gives CPUs below
//! `MAX_CPUS`, and formats back to a canonical list that parses to the same set.
#![no_main]

use libfuzzer_sys::fuzz_target;
use runtime_hooks::cgroup::{format_cpu_list, parse_cpu_list, MAX_CPUS};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(cpus) = parse_cpu_list(text) else { return };
    assert!(cpus.iter().all(|&c| c < MAX_CPUS));
    let canonical = format_cpu_list(&cpus);
    assert_eq!(parse_cpu_list(&canonical).as_ref(), Ok(&cpus), "{canonical:?}");
    assert_eq!(format_cpu_list(&parse_cpu_list(&canonical).unwrap()), canonical);
});
