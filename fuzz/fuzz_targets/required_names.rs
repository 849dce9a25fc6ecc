//! The required-hook-servers annotation (`runtime_proxy::hooks::chain`): any value a pod author
//! writes gives at most `MAX_REQUIRED_SERVERS` names or a refusal, in one pass, and every message
//! built from it stays short (a few names shown, the rest counted).
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use runtime_proxy::hooks::chain::{
    list_shown, parse_names, shown, Required, MAX_REQUIRED_SERVERS, REQUIRED_ANNOTATION,
};
use runtime_proxy::metrics::Metrics;

fuzz_target!(|data: &[u8]| {
    let value = String::from_utf8_lossy(data).into_owned();
    match parse_names(&value) {
        Ok(names) => {
            assert!(names.len() <= MAX_REQUIRED_SERVERS);
            assert!(names.iter().all(|n| !n.is_empty() && n.trim() == n && !n.contains(',')));
            let unique: std::collections::HashSet<&String> = names.iter().collect();
            assert_eq!(unique.len(), names.len(), "each name once");
            let message = list_shown(&names.iter().map(|n| shown(n)).collect::<Vec<_>>());
            assert!(message.chars().count() <= 3 * (64 + 3) + 30, "{} chars", message.chars().count());
            assert!(!message.chars().any(|c| c.is_control()), "control characters are escaped");
        }
        Err(e) => assert_eq!(e.at_least, MAX_REQUIRED_SERVERS + 1),
    }
    let annotations: BTreeMap<String, String> = [(REQUIRED_ANNOTATION.to_owned(), value)].into();
    let r = Required::of_pod(&["node.json".to_owned()], &annotations, None, &[], "fuzz", &Metrics::new(), true);
    assert!(r.servers.len() <= MAX_REQUIRED_SERVERS + 1);
    assert_eq!(r.servers[0].0, "node.json");
    assert!(r.refusal().is_none_or(|m| m.len() < 200));
});
