//! The hook server registration file parser (`runtime_proxy::hooks::registry::parse`): any bytes (as
//! found in `/etc/runtime/hookserver.d`) give a server or an error, never a panic, and an accepted
//! file gives a server within the documented limits.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use runtime_proxy::hooks::registry::{parse, MAX_TIMEOUT};

fuzz_target!(|data: &[u8]| {
    let Ok((server, _warnings)) = parse(Path::new("/etc/runtime/hookserver.d/fuzz.json"), data) else { return };
    assert_eq!(server.name, "fuzz.json");
    assert!(server.endpoint.is_absolute(), "endpoint {:?}", server.endpoint);
    assert!(!server.endpoint.as_os_str().as_encoded_bytes().contains(&0));
    assert!(!server.timeout.is_zero() && server.timeout <= MAX_TIMEOUT);
    let _ = server.stages_list();
});
