//! runtime-hooks' Kubernetes quantity parser (`Quantity::from_str`, and its serde form, a JSON
//! string or number): never panics; an accepted quantity prints as a plain decimal that parses
//! back to the same value, and `value()` / `milli_value()` round up.
#![no_main]

use libfuzzer_sys::fuzz_target;
use runtime_hooks::quantity::Quantity;

fuzz_target!(|data: &[u8]| {
    if let Ok(json) = serde_json::from_slice::<Quantity>(data) {
        check(json);
    }
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(q) = text.parse::<Quantity>() {
        check(q);
    }
});

fn check(q: Quantity) {
    let printed = q.to_string();
    let back: Quantity =
        printed.parse().unwrap_or_else(|e| panic!("{q:?} printed as {printed:?}, which does not parse: {e}"));
    assert_eq!(back, q, "printed as {printed:?}");
    let (v, m) = (q.value(), q.milli_value());
    assert_eq!(q.is_negative(), printed.starts_with('-'));
    // Rounded up: value() * 1000 >= milli_value() (when it does not saturate).
    if let Some(v1000) = v.checked_mul(1000) {
        assert!(v1000 >= m, "value {v} milli {m} for {printed}");
    }
}
