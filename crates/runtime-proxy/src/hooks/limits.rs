//! Bounds on what one client or one hook server can make the proxy hold or do. Each is a flag
//! (see [`crate::cli::Args`]) with a default well above anything kubelet or koordlet sends;
//! going over one is answered with a status naming the limit and its flag, never a crash or
//! unbounded memory.

use std::collections::BTreeMap;
use std::time::Duration;

/// The limits in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest intercepted request body read into memory (bytes), compressed or not; kubelet's
    /// own message limit is 16 MiB. `--max-request-bytes`.
    pub max_request_bytes: usize,
    /// Longest an intercepted request's body may stall between two frames before the call is
    /// answered `DEADLINE_EXCEEDED` (Docker mode: `408`). `--request-idle-timeout`.
    pub request_idle_timeout: Duration,
    /// Most concurrent calls (HTTP/2 streams) on one client connection; more wait in the client.
    /// `--max-concurrent-streams`.
    pub max_concurrent_streams: u32,
    /// What a hook answer may cost.
    pub hooks: HookLimits,
}

/// Bounds on one hook server answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HookLimits {
    /// Largest encoded answer (bytes). `--max-hook-answer-bytes`.
    pub max_answer_bytes: usize,
    /// Most entries an answer may add to one map (envs, labels, annotations).
    /// `--max-hook-added-entries`.
    pub max_added_entries: usize,
    /// Largest key + value (bytes) of an entry an answer adds or changes. `--max-hook-entry-bytes`.
    pub max_entry_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_request_bytes: 16 << 20,
            request_idle_timeout: Duration::from_secs(30),
            max_concurrent_streams: 1000,
            hooks: HookLimits::default(),
        }
    }
}

impl Default for HookLimits {
    fn default() -> Self {
        HookLimits { max_answer_bytes: 16 << 20, max_added_entries: 1024, max_entry_bytes: 256 << 10 }
    }
}

impl HookLimits {
    /// Checks what an answer does to one map of the request (`what`: `container_envs`, …):
    /// the entries it adds, and the size of each entry it adds or changes.
    ///
    /// Errors: the first limit exceeded, naming the map, the count or entry and the flag.
    pub fn check_map(
        &self,
        what: &str,
        request: &BTreeMap<String, String>,
        answer: &BTreeMap<String, String>,
    ) -> Result<(), String> {
        let added = answer.keys().filter(|k| !request.contains_key(*k)).count();
        if added > self.max_added_entries {
            return Err(format!(
                "answer adds {added} {what} entries, more than {} (--max-hook-added-entries)",
                self.max_added_entries
            ));
        }
        for (k, v) in answer {
            if request.get(k) != Some(v) && k.len() + v.len() > self.max_entry_bytes {
                let key: String = k.chars().take(64).collect();
                return Err(format!(
                    "answer sets {what} entry {key:?} of {} bytes, more than {} (--max-hook-entry-bytes)",
                    k.len() + v.len(),
                    self.max_entry_bytes
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_are_bounded() {
        let l = HookLimits { max_answer_bytes: 0, max_added_entries: 2, max_entry_bytes: 10 };
        let req: BTreeMap<String, String> = [("A".to_string(), "1".repeat(20))].into();
        let mut ans = req.clone();
        assert!(l.check_map("container_envs", &req, &ans).is_ok(), "an echoed oversized entry is the request's own");
        ans.insert("B".into(), "2".into());
        ans.insert("C".into(), "3".into());
        assert!(l.check_map("container_envs", &req, &ans).is_ok(), "two added");
        ans.insert("D".into(), "4".into());
        let err = l.check_map("container_envs", &req, &ans).unwrap_err();
        assert!(err.contains("adds 3 container_envs entries, more than 2"), "{err}");
        let mut big = req.clone();
        big.insert("K".into(), "v".repeat(10));
        let err = l.check_map("labels", &req, &big).unwrap_err();
        assert!(err.contains("\"K\" of 11 bytes, more than 10 (--max-hook-entry-bytes)"), "{err}");
    }
}
