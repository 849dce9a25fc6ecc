//! Docker mode's request routing (`docker::intercept::route`, with the API version prefix) and
//! query parsing (`query_param`, `percent_decode`, how `?name=` of a create is read): any method,
//! path and query give a route or none and a value or none, never a panic; a route's ID is never
//! empty and never holds a `/`; percent-encoding any bytes decodes back to them.
//!
//! Input: byte 0 picks the method, the rest is `PATH[?QUERY]`.
#![no_main]

use http::Method;
use libfuzzer_sys::fuzz_target;
use runtime_proxy::docker::intercept::{percent_decode, query_param, route, Route};

fuzz_target!(|data: &[u8]| {
    let Some((sel, rest)) = data.split_first() else { return };
    let method = [Method::POST, Method::DELETE, Method::GET, Method::PUT][usize::from(sel % 4)].clone();
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let (path, query) = text.split_once('?').unwrap_or((text, ""));
    match route(&method, path) {
        Some(Route::Start(id) | Route::Stop(id) | Route::Update(id) | Route::Delete(id)) => {
            assert!(!id.is_empty() && !id.contains('/'), "{path:?} gave ID {id:?}");
        }
        Some(Route::Create) => assert!(path.ends_with("/containers/create"), "{path:?}"),
        None => {}
    }
    let _ = query_param(query, "name");
    // Every byte escaped: decodes to the text itself.
    let escaped: String = text.bytes().map(|b| format!("%{b:02x}")).collect();
    assert_eq!(percent_decode(&escaped), text);
    assert_eq!(query_param(&format!("a=1&name={escaped}&b"), "name").as_deref(), Some(text));
});
