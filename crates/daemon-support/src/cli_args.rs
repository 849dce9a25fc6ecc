//! The command line as both binaries read it: koord's spellings of klog's flags first
//! ([`crate::klog::koord_args`]), then clap, whose suggestion for a mistyped flag is replaced
//! by [`closest_flag`] where that finds a flag sharing its words.
//!
//! clap suggests the flag spelled most alike (Jaro similarity), which favours a long common
//! prefix over meaning: `--backend-runtime-endpoint` got `--backend-runtime-mode`, though the
//! flag meant is `--remote-runtime-service-endpoint`. A flag's words name what it sets, its last
//! word the kind of value (`-endpoint`, `-mode`, `-addr`), so the closest flag is the one sharing
//! the most words, the last word counting twice; spelling decides between equals.

use std::ffi::OsString;

use clap::error::{ContextKind, ContextValue, ErrorKind};

/// Parses the process's command line with `cmd` (see the module docs); on an error, prints it
/// and exits as clap does (exit 2; 0 for `--help` and `--version`).
pub fn get_matches(cmd: clap::Command) -> clap::ArgMatches {
    try_get_matches_from(cmd, std::env::args_os()).unwrap_or_else(|e| e.exit())
}

/// [`get_matches`] for the command line `args` (program name first).
///
/// Errors: clap's, an unknown flag's suggestion replaced by [`closest_flag`] when it finds one.
pub fn try_get_matches_from<I: IntoIterator<Item = OsString>>(
    mut cmd: clap::Command,
    args: I,
) -> Result<clap::ArgMatches, clap::Error> {
    let args = crate::klog::koord_args(args);
    let err = match cmd.try_get_matches_from_mut(args.iter().cloned()) {
        Ok(m) => return Ok(m),
        Err(e) => e,
    };
    if err.kind() != ErrorKind::UnknownArgument {
        return Err(err);
    }
    let Some(ContextValue::String(invalid)) = err.get(ContextKind::InvalidArg) else {
        return Err(err);
    };
    let Some(typed) = invalid.strip_prefix("--").map(|t| t.split('=').next().unwrap_or(t).to_owned()) else {
        return Err(err);
    };
    // The root command's flags only: a flag after a subcommand is the subcommand's to suggest.
    let subcommands: Vec<&str> = cmd.get_subcommands().map(|s| s.get_name()).collect();
    let before = args.iter().skip(1).take_while(|a| a.to_str() != Some(invalid.as_str()));
    if before.clone().any(|a| a.to_str().is_some_and(|a| subcommands.contains(&a))) {
        return Err(err);
    }
    let longs: Vec<String> = cmd
        .get_arguments()
        .flat_map(|a| a.get_long().into_iter().chain(a.get_all_aliases().unwrap_or_default()))
        .map(str::to_owned)
        .collect();
    let Some(best) = closest_flag(&typed, longs.iter().map(String::as_str)) else {
        return Err(err);
    };
    let mut fixed = clap::Error::new(ErrorKind::UnknownArgument).with_cmd(&cmd);
    fixed.insert(ContextKind::InvalidArg, ContextValue::String(invalid.clone()));
    fixed.insert(ContextKind::SuggestedArg, ContextValue::String(format!("--{best}")));
    if err.get(ContextKind::Usage).is_some() {
        // clap's usage line names the flag it suggested: the plain usage instead.
        fixed.insert(ContextKind::Usage, ContextValue::StyledStr(cmd.render_usage()));
    }
    Err(fixed)
}

/// The flag of `longs` (names without `--`) closest to `typed` (see the module docs): the most
/// words in common (split at `-` and `_`), the last word counting twice, at least two in all
/// (a shared last word alone is enough);
/// the fewest edits ([`edits`]) between equals. `None`: no flag shares that much.
pub fn closest_flag<'a>(typed: &str, longs: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let words = |s: &'a str| s.split(['-', '_']).filter(|w| !w.is_empty()).collect::<Vec<_>>();
    let typed_words: Vec<&str> = typed.split(['-', '_']).filter(|w| !w.is_empty()).collect();
    let mut best: Option<(usize, usize, &str)> = None;
    for long in longs {
        if long == typed {
            continue;
        }
        let theirs = words(long);
        let mut score = typed_words.iter().filter(|w| theirs.contains(w)).count();
        if typed_words.last().is_some() && typed_words.last() == theirs.last() {
            score += 1;
        }
        if score < 2 {
            continue;
        }
        let edits = edits(typed, long);
        if best.is_none_or(|(s, e, _)| score > s || (score == s && edits < e)) {
            best = Some((score, edits, long));
        }
    }
    best.map(|(_, _, long)| long)
}

/// The Levenshtein distance between `a` and `b` (characters inserted, removed or replaced),
/// counted up to [`MAX_EDITS_COUNTED`] characters of each (a flag name is far shorter).
pub fn edits(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().take(MAX_EDITS_COUNTED).collect();
    let b: Vec<char> = b.chars().take(MAX_EDITS_COUNTED).collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diagonal + usize::from(ca != cb)).min(row[j] + 1).min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// How many characters of each name [`edits`] compares.
pub const MAX_EDITS_COUNTED: usize = 128;

#[cfg(test)]
mod tests {
    use super::*;

    const LONGS: [&str; 8] = [
        "backend-runtime-mode",
        "remote-runtime-service-endpoint",
        "remote-image-service-endpoint",
        "koord-runtimeproxy-endpoint",
        "metrics-addr",
        "debug-addr",
        "hook-config-dir",
        "hook-conflict-policy",
    ];

    #[test]
    fn the_flag_sharing_most_words_wins() {
        let closest = |typed| closest_flag(typed, LONGS);
        assert_eq!(closest("backend-runtime-endpoint"), Some("remote-runtime-service-endpoint"));
        assert_eq!(closest("runtime-endpoint"), Some("remote-runtime-service-endpoint"));
        assert_eq!(closest("image-endpoint"), Some("remote-image-service-endpoint"));
        assert_eq!(closest("backend-runtime-mod"), Some("backend-runtime-mode"));
        assert_eq!(closest("metric-addr"), Some("metrics-addr"), "spelling decides between equals");
        assert_eq!(closest("hook-config-dri"), Some("hook-config-dir"));
        assert_eq!(closest("hook_config_dir"), Some("hook-config-dir"));
        assert_eq!(closest("remote"), None, "one word in common, not the last, is too little");
        assert_eq!(
            closest("endpoint"),
            Some("koord-runtimeproxy-endpoint"),
            "the last word alone counts twice; the fewest edits"
        );
        assert_eq!(closest("ouptut"), None);
        assert_eq!((edits("kitten", "sitting"), edits("", "abc"), edits("same", "same")), (3, 3, 0));
    }
}
