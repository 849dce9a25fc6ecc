//! The `grpc-timeout` header parser (`runtime_proxy::grpc::parse_timeout`): any header value gives
//! a deadline or none, never a panic, and a deadline only for the gRPC grammar: 1 to 8 ASCII
//! digits and one of the units H M S m u n.
#![no_main]

use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use runtime_proxy::grpc::parse_timeout;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = HeaderValue::from_bytes(data) else { return };
    let mut headers = HeaderMap::new();
    headers.insert("grpc-timeout", value);
    let Some(timeout) = parse_timeout(&headers) else { return };
    let (digits, unit) = data.split_at(data.len() - 1);
    assert!(
        (1..=8).contains(&digits.len()) && digits.iter().all(u8::is_ascii_digit),
        "accepted {:?}",
        String::from_utf8_lossy(data)
    );
    let n: u64 = std::str::from_utf8(digits).unwrap().parse().unwrap();
    let want = match unit {
        b"H" => Duration::from_secs(n * 3600),
        b"M" => Duration::from_secs(n * 60),
        b"S" => Duration::from_secs(n),
        b"m" => Duration::from_millis(n),
        b"u" => Duration::from_micros(n),
        b"n" => Duration::from_nanos(n),
        _ => panic!("accepted unit {unit:?}"),
    };
    assert_eq!(timeout, want);
});
