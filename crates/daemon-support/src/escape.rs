//! Control characters made visible, for text that came from elsewhere (a hook server's error
//! message, a pod's name, the runtime's answer) and is shown on an operator's terminal: by
//! `status` ([`crate::status`]) and in the log ([`crate::log`]).
//!
//! A raw ESC starts a terminal escape sequence (move the cursor, erase rows, recolour, set the
//! window title), a CR returns to the start of the line and overwrites it, a BS erases the
//! character before; C1 controls (U+0080–U+009F) are 8-bit forms of the same sequences (U+009B
//! is CSI) in some terminals; bidirectional overrides reorder what is shown. Each is written as
//! an escape instead, the way Rust and tracing-subscriber write them: `\x1b`, `\r`, `\n`,
//! `\t`, `\x08`, `\x7f`, `\u{9b}`, `\u{202e}`. Backslashes are kept as they are.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` is shown escaped by [`escape_control`]: C0 controls (U+0000–U+001F: ESC, CR,
/// LF, TAB, BS, …), DEL (U+007F), C1 controls (U+0080–U+009F), and the bidirectional
/// embeddings, overrides and isolates (U+202A–U+202E, U+2066–U+2069).
pub fn is_escaped(c: char) -> bool {
    matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every character [`is_escaped`] written as an escape: `\t`, `\n`, `\r` for those
/// three, `\xNN` for the other C0 controls and DEL (ESC is `\x1b`), `\u{NN}` for C1 and
/// bidirectional controls (`\u{9b}`, `\u{202e}`). Borrowed when there is nothing to escape.
pub fn escape_control(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_escaped) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\u{0}'..='\u{1f}' | '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if is_escaped(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// `value` with every string in it, object keys included, passed through [`escape_control`]:
/// a `/status` document made safe to print, whatever its renderer shows of it.
pub fn escape_json_strings(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::String(s) => {
            if let Cow::Owned(escaped) = escape_control(s) {
                *s = escaped;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(escape_json_strings),
        Value::Object(map) => {
            let entries = std::mem::take(map);
            for (key, mut v) in entries {
                escape_json_strings(&mut v);
                map.insert(escape_control(&key).into_owned(), v);
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// JSON text with the characters that serde_json writes raw but a terminal may act on — DEL,
/// C1 and bidirectional controls — written as `\uXXXX` escapes (C0 controls are escaped by
/// every JSON writer already). Outside strings JSON text is ASCII without these, so the
/// document read back is the same.
pub fn escape_json_text(json: &str) -> Cow<'_, str> {
    // C0 controls outside strings are the text's own layout (newlines of pretty-printing).
    let raw = |c: char| is_escaped(c) && c >= '\u{7f}';
    if !json.chars().any(raw) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 8);
    for c in json.chars() {
        if raw(c) {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        assert!(matches!(escape_control("plain text, ünïcode, C:\\path"), Cow::Borrowed(_)));
        assert_eq!(escape_control("a\x1b[2Jb"), "a\\x1b[2Jb", "ESC");
        assert_eq!(escape_control("ok\rFAILING"), "ok\\rFAILING", "CR");
        assert_eq!(escape_control("x\x08\x08y\x7f"), "x\\x08\\x08y\\x7f", "BS and DEL");
        assert_eq!(escape_control("l1\nl2\tz\0"), "l1\\nl2\\tz\\x00", "LF, TAB, NUL");
        assert_eq!(escape_control("\u{9b}31m red"), "\\u{9b}31m red", "C1 CSI");
        assert_eq!(escape_control("\u{85}\u{80}\u{9f}"), "\\u{85}\\u{80}\\u{9f}", "C1 bounds");
        assert_eq!(escape_control("abc\u{202e}fed"), "abc\\u{202e}fed", "bidi override");
        assert_eq!(escape_control("\u{a0}\u{2028}"), "\u{a0}\u{2028}", "not controls: kept");
    }

    #[test]
    fn documents_are_escaped_everywhere_and_json_text_stays_the_same_document() {
        let mut doc = serde_json::json!({
            "hook_servers": [{"name": "a\x1b]0;x\x07.json", "last_error": "PreRunPodSandbox: Unknown: \r\x1b[1A\x1b[2Kok"}],
            "pod\u{9b}": {"n": 1, "ok": true, "none": null},
        });
        escape_json_strings(&mut doc);
        let text = doc.to_string();
        assert!(!text.chars().any(is_escaped), "{text}");
        assert_eq!(doc["hook_servers"][0]["name"], "a\\x1b]0;x\\x07.json");
        assert_eq!(doc["hook_servers"][0]["last_error"], "PreRunPodSandbox: Unknown: \\r\\x1b[1A\\x1b[2Kok");
        assert_eq!(doc["pod\\u{9b}"]["n"], 1);

        let raw = serde_json::json!({"e": "a\u{9b}b\u{7f}c\u{202e}"});
        let text = escape_json_text(&serde_json::to_string_pretty(&raw).unwrap()).into_owned();
        assert!(!text.chars().any(is_escaped_but_newline), "{text:?}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&text).unwrap(), raw, "the same document");
    }

    fn is_escaped_but_newline(c: char) -> bool {
        is_escaped(c) && c != '\n'
    }
}
