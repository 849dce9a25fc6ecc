//! docs/flags.md against the binaries' `--help`, so that the flag reference cannot drift.
//!
//! # The rule
//!
//! For a program (`runtime-proxy`, `runtime-hooks`), its section of docs/flags.md is the text from
//! its `## <program>` heading to the next `## ` heading. Then:
//!
//! * every long flag the program's `--help` shows (`--help` and `--version` aside: clap's own) is
//!   named somewhere in the section, and so is every long flag of each subcommand's `--help`
//!   (`status`);
//! * every flag in the first column of the section's flag table is in the program's `--help`;
//! * every flag named in a subcommand's paragraph (the one starting with
//!   ``**`<program> <subcommand>`**``) is in that subcommand's `--help`.
//!
//! Flags named elsewhere in the prose (koord's klog flags, hidden from `--help`) are not checked
//! against the help. [`check`] runs the binaries; [`compare`] is the rule itself, on text.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// Long flags clap adds to every command; the reference does not list them.
const CLAP_OWN: [&str; 2] = ["--help", "--version"];

/// Checks the `program` section of the Markdown file `doc` (docs/flags.md) against the `--help` of
/// the binary `bin` and of its `subcommands` (`bin SUB --help`), as the module's rule says.
///
/// # Errors
///
/// Every disagreement, one per line, naming the flag and where it is missing; or why a binary
/// could not be run or the file not read.
pub fn check(doc: &Path, program: &str, bin: &Path, subcommands: &[&str]) -> Result<(), String> {
    let text = std::fs::read_to_string(doc).map_err(|e| format!("{}: cannot read: {e}", doc.display()))?;
    let main_help = help(bin, &[])?;
    let subs = subcommands.iter().map(|sub| Ok((*sub, help(bin, &[sub])?))).collect::<Result<Vec<_>, String>>()?;
    compare(&text, program, &main_help, &subs)
}

/// `bin ARGS --help`'s standard output.
fn help(bin: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new(bin)
        .args(args)
        .arg("--help")
        .output()
        .map_err(|e| format!("{}: cannot run: {e}", bin.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} {} --help: {}: {}",
            bin.display(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8(out.stdout).map_err(|e| format!("{} --help: not UTF-8: {e}", bin.display()))
}

/// The module's rule on text: `doc` is docs/flags.md, `main_help` the program's `--help`,
/// `subcommands` each subcommand's name and `--help`.
///
/// # Errors
///
/// Every disagreement, one per line; a missing `## <program>` section or flag table is one too.
pub fn compare(doc: &str, program: &str, main_help: &str, subcommands: &[(&str, String)]) -> Result<(), String> {
    let Some(section) = section(doc, program) else {
        return Err(format!("docs/flags.md has no `## {program}` section"));
    };
    let mut problems = Vec::new();
    let main_flags = help_flags(main_help);
    let table = table_flags(section);
    if table.is_empty() {
        problems.push(format!("the `## {program}` section has no flag table"));
    }
    let mut all_help = vec![(program.to_owned(), main_flags.clone())];
    for (sub, sub_help) in subcommands {
        all_help.push((format!("{program} {sub}"), help_flags(sub_help)));
    }
    for (command, flags) in &all_help {
        for flag in flags.iter().filter(|f| !mentions(section, f)) {
            problems.push(format!("`{command} --help` shows {flag}, which the `## {program}` section does not name"));
        }
    }
    for flag in table.difference(&main_flags) {
        problems.push(format!("the `## {program}` table lists {flag}, which `{program} --help` does not show"));
    }
    for (sub, sub_help) in subcommands {
        let heading = format!("**`{program} {sub}`**");
        let Some(paragraph) = paragraph(section, &heading) else {
            problems.push(format!("the `## {program}` section has no paragraph starting with {heading}"));
            continue;
        };
        let sub_flags = help_flags(sub_help);
        for flag in flags_in(paragraph).difference(&sub_flags) {
            problems
                .push(format!("the {heading} paragraph names {flag}, which `{program} {sub} --help` does not show"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// The text from the `## <program>` heading to the next `## ` heading (or the end).
fn section<'a>(doc: &'a str, program: &str) -> Option<&'a str> {
    let heading = format!("## {program}\n");
    let start = if doc.starts_with(&heading) { 0 } else { doc.find(&format!("\n{heading}"))? + 1 };
    let body = &doc[start + heading.len()..];
    Some(body.find("\n## ").map_or(body, |end| &body[..end]))
}

/// The paragraph (up to a blank line) whose first line starts with `start`.
fn paragraph<'a>(section: &'a str, start: &str) -> Option<&'a str> {
    let at = section.split("\n\n").find(|p| p.trim_start().starts_with(start))?;
    Some(at)
}

/// The long flags of a clap help text: the `--name` words at the start of each option line
/// (`  -h, --help`, `      --frontend <FRONTEND>`), not those in the descriptions; clap's own
/// left out.
fn help_flags(help: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    for line in help.lines().map(str::trim_start).filter(|l| l.starts_with('-')) {
        for word in line.split_whitespace() {
            let word = word.trim_end_matches(',');
            if let Some(name) = word.strip_prefix("--") {
                // `--flag=<V>`, `--flag[=<BOOL>]`: the name only
                let len = name.find(|c: char| !is_name_char(c)).unwrap_or(name.len());
                flags.insert(format!("--{}", &name[..len]));
            } else if !(word.starts_with('-') || word.starts_with('<') || word.starts_with('[')) {
                break;
            }
        }
    }
    for own in CLAP_OWN {
        flags.remove(own);
    }
    flags
}

/// The flags in the first column of the section's Markdown table rows (`| \`--flag X\` / ... |`).
fn table_flags(section: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    for row in section.lines().filter(|l| l.starts_with("| `--")) {
        let cells = &row[1..];
        // the first cell ends at the first `|` that is not escaped (`Containerd\|Docker`)
        let bytes = cells.as_bytes();
        let end = (0..bytes.len()).find(|&i| bytes[i] == b'|' && (i == 0 || bytes[i - 1] != b'\\'));
        flags.extend(flags_in(&cells[..end.unwrap_or(cells.len())]));
    }
    flags
}

/// Every `--name` in `text` (name: ASCII lowercase letters, digits, `-`, `_`).
fn flags_in(text: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("--") {
        let before = text.len() - rest.len() + at;
        let after = &rest[at + 2..];
        let len = after.find(|c: char| !is_name_char(c)).unwrap_or(after.len());
        let preceded = text[..before].chars().next_back().is_some_and(|c| is_name_char(c) || c == '-');
        if len > 0 && !preceded && after.starts_with(|c: char| c.is_ascii_lowercase()) {
            flags.insert(format!("--{}", &after[..len]));
        }
        rest = &after[len..];
    }
    flags
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_'
}

/// Whether `text` names `flag` as a whole word (`--metrics-addr` is not named by `--metrics-addrs`).
fn mentions(text: &str, flag: &str) -> bool {
    flags_in(text).contains(flag)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELP: &str = "A proxy.\n\nUsage: demo [OPTIONS] [COMMAND]\n\nCommands:\n  status  Print it\n\nOptions:\n      \
                        --listen <PATH>\n          Where to listen; see --frontend\n      --frontend <FRONTEND>\n          \
                        [default: cri]\n      --insecure\n      --strict[=<BOOL>]\n  -h, --help\
                        \n          Print help\n  -V, --version\n          Print version\n";
    const STATUS_HELP: &str =
        "Usage: demo status [OPTIONS]\n\nOptions:\n      --output <OUTPUT>  text or json\n  -h, --help  Print help\n";

    fn doc(rows: &[&str], status: &str) -> String {
        format!(
            "# Flags\n\n## demo\n\n| flag | default | meaning |\n|---|---|---|\n{}\n\n{status}\n\nklog's `--v` too.\n\n## other\n\n| `--elsewhere` | | |\n",
            rows.join("\n")
        )
    }
    const ROWS: [&str; 4] = [
        "| `--listen PATH` | `/run/x` | where; not `--frontend` |",
        "| `--frontend cri\\|nri` | `cri` | which |",
        "| `--insecure` | off | for development |",
        "| `--strict[=BOOL]` | `false` | Go's bool syntax |",
    ];
    const STATUS: &str = "**`demo status`** prints it (`--output json`).";

    fn subs() -> Vec<(&'static str, String)> {
        vec![("status", STATUS_HELP.to_owned())]
    }

    #[test]
    fn help_flags_are_the_option_lines_own() {
        let flags: Vec<_> = help_flags(HELP).into_iter().collect();
        assert_eq!(flags, ["--frontend", "--insecure", "--listen", "--strict"]);
    }

    #[test]
    fn table_flags_are_the_first_column_only() {
        let flags: Vec<_> = table_flags(&doc(&ROWS, STATUS)).into_iter().collect();
        assert_eq!(
            flags,
            ["--elsewhere", "--frontend", "--insecure", "--listen", "--strict"],
            "all rows of the text given"
        );
        let flags: Vec<_> = table_flags(section(&doc(&ROWS, STATUS), "demo").unwrap()).into_iter().collect();
        assert_eq!(flags, ["--frontend", "--insecure", "--listen", "--strict"]);
    }

    #[test]
    fn a_doc_that_agrees_passes() {
        assert_eq!(compare(&doc(&ROWS, STATUS), "demo", HELP, &subs()), Ok(()));
    }

    #[test]
    fn a_flag_missing_from_the_doc_fails() {
        let err = compare(&doc(&[ROWS[0], ROWS[1], ROWS[3]], STATUS), "demo", HELP, &subs()).unwrap_err();
        assert_eq!(err, "`demo --help` shows --insecure, which the `## demo` section does not name");
        // named only in another section is not named
        let other = doc(&[ROWS[0], ROWS[1], ROWS[3]], STATUS).replace("`--elsewhere`", "`--insecure`");
        assert!(compare(&other, "demo", HELP, &subs()).is_err());
        // nor is a longer flag that starts with it
        let longer = doc(&[ROWS[0], ROWS[1], ROWS[3], "| `--insecure-mode` | | |"], STATUS);
        assert!(compare(&longer, "demo", HELP, &subs()).unwrap_err().contains("shows --insecure,"));
    }

    #[test]
    fn a_subcommand_flag_missing_from_the_doc_fails() {
        let err = compare(&doc(&ROWS, "**`demo status`** prints it."), "demo", HELP, &subs()).unwrap_err();
        assert_eq!(err, "`demo status --help` shows --output, which the `## demo` section does not name");
    }

    #[test]
    fn a_documented_flag_the_help_lacks_fails() {
        let err = compare(
            &doc(&[ROWS[0], ROWS[1], ROWS[2], ROWS[3], "| `--gone N` | 1 | removed |"], STATUS),
            "demo",
            HELP,
            &subs(),
        )
        .unwrap_err();
        assert_eq!(err, "the `## demo` table lists --gone, which `demo --help` does not show");
        let err =
            compare(&doc(&ROWS, "**`demo status`** prints it (`--output json`, `--wait`)."), "demo", HELP, &subs())
                .unwrap_err();
        assert_eq!(err, "the **`demo status`** paragraph names --wait, which `demo status --help` does not show");
    }

    #[test]
    fn a_missing_section_or_paragraph_fails() {
        assert!(compare(&doc(&ROWS, STATUS), "absent", HELP, &[]).unwrap_err().contains("no `## absent` section"));
        let err = compare(&doc(&ROWS, "`--output`"), "demo", HELP, &subs()).unwrap_err();
        assert!(err.contains("no paragraph starting with **`demo status`**"), "{err}");
    }
}
