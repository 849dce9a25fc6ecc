//! `cli-docs PROGRAM DESTDIR`: writes PROGRAM's man pages and shell completions, generated from its own
//! clap definition (the `Args` its binary parses), below DESTDIR at the paths a Debian package installs
//! them to. scripts/package.sh runs it for `runtime-proxy` and `runtime-hooks` into each package's staging
//! tree; nothing of it ships in the daemons themselves.
//!
//! Files, PROGRAM being `runtime-proxy` or `runtime-hooks`:
//!
//! * `usr/share/man/man8/PROGRAM.8` and `PROGRAM-SUB.8` per visible subcommand (`status`), in roff
//!   (clap_mangen), section 8 (system administration: both are daemons run as root), with a SEE ALSO
//!   section naming the other pages and the operations guide; package.sh compresses them (`gzip -9n`);
//! * `usr/share/bash-completion/completions/PROGRAM` (bash-completion's on-demand directory);
//! * `usr/share/zsh/vendor-completions/_PROGRAM` (Debian's zsh vendor directory);
//! * `usr/share/fish/vendor_completions.d/PROGRAM.fish` (fish's vendor directory).
//!
//! Hidden flags (koord's klog spellings) appear in neither. Exit 0 when every file is written; 2 for a
//! wrong command line; 1, with the path, when a file cannot be written.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::CommandFactory;
use clap_complete::Shell;

/// The programs this writes for, by name: their clap command as their binaries parse it.
fn command(program: &str) -> Option<clap::Command> {
    match program {
        "runtime-proxy" => Some(runtime_proxy::cli::Args::command()),
        "runtime-hooks" => Some(runtime_hooks::cli::Args::command()),
        _ => None,
    }
}

/// The man section of both programs' pages: system administration commands and daemons.
const SECTION: &str = "8";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [program, dest] = args.as_slice() else {
        eprintln!("usage: cli-docs runtime-proxy|runtime-hooks DESTDIR");
        return ExitCode::from(2);
    };
    let Some(cmd) = command(program) else {
        eprintln!("cli-docs: {program:?}: not a program of this workspace (runtime-proxy, runtime-hooks)");
        return ExitCode::from(2);
    };
    match write_all(cmd, program, Path::new(dest)) {
        Ok(files) => {
            for f in files {
                println!("{}", f.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cli-docs: {e}");
            ExitCode::from(1)
        }
    }
}

/// Writes every file of the module docs for `cmd` (named `program`) below `dest`, creating the directories;
/// returns the paths written.
///
/// Errors: a directory or file that cannot be created or written, naming it.
fn write_all(mut cmd: clap::Command, program: &str, dest: &Path) -> Result<Vec<PathBuf>, String> {
    cmd = cmd.bin_name(program.to_owned());
    cmd.build();
    let mut written = Vec::new();

    let man_dir = dest.join("usr/share/man").join(format!("man{SECTION}"));
    let mut pages = vec![cmd.clone()];
    pages.extend(cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
    let names: Vec<String> = pages.iter().map(|p| p.get_display_name().unwrap_or(p.get_name()).to_owned()).collect();
    for (page, name) in pages.into_iter().zip(&names) {
        let mut roff = Vec::new();
        let man = clap_mangen::Man::new(page).section(SECTION).manual("System Administration");
        man.render(&mut roff).map_err(|e| format!("rendering {name}'s man page: {e}"))?;
        roff.extend_from_slice(see_also(program, name, &names).as_bytes());
        written.push(write(&man_dir.join(format!("{name}.{SECTION}")), &roff)?);
    }

    for (shell, path) in [
        (Shell::Bash, format!("usr/share/bash-completion/completions/{program}")),
        (Shell::Zsh, format!("usr/share/zsh/vendor-completions/_{program}")),
        (Shell::Fish, format!("usr/share/fish/vendor_completions.d/{program}.fish")),
    ] {
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut cmd, program, &mut script);
        if shell == Shell::Bash {
            script = bash_subcommand_arms(&String::from_utf8_lossy(&script), program).into_bytes();
        }
        written.push(write(&dest.join(path), &script)?);
    }
    Ok(written)
}

/// clap_complete's bash script for a program whose name holds a `-` (4.6.12): the words loop sets `cmd` to
/// `runtime__hooks__subcmd__status` (the name's `-` as `__`), but the case arm holding the subcommand's options
/// is `runtime__subcmd__hooks__subcmd__status` (every `-` as `__subcmd__`), so nothing after `runtime-hooks
/// status` completed. The arms are renamed to what the loop sets.
fn bash_subcommand_arms(script: &str, program: &str) -> String {
    let arm = format!("{}__subcmd__", program.replace('-', "__subcmd__"));
    let set = format!("{}__subcmd__", program.replace('-', "__"));
    script.replace(&arm, &set)
}

/// The SEE ALSO section of page `this` (roff): the program's other pages, the other program's page and
/// the operations guide the package installs.
fn see_also(program: &str, this: &str, pages: &[String]) -> String {
    let other = if program == "runtime-proxy" { "runtime-hooks" } else { "runtime-proxy" };
    let mut refs: Vec<String> =
        pages.iter().filter(|p| p.as_str() != this).map(|p| format!("\\fB{p}\\fR({SECTION})")).collect();
    refs.push(format!("\\fB{other}\\fR({SECTION})"));
    refs.push("\\fBsystemctl\\fR(1)".to_owned());
    format!(
        ".SH \"SEE ALSO\"\n{}\n.PP\nThe operations guide (install, configure, upgrade, troubleshoot, remove): \
         /usr/share/doc/{program}/operations.md. Flags are read from /etc/default/{program} by {program}.service.\n",
        refs.join(",\n")
    )
}

/// Writes `bytes` to `path`, creating its directory.
///
/// Errors: naming the directory or file that could not be created or written.
fn write(path: &Path, bytes: &[u8]) -> Result<PathBuf, String> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    let mut f = fs::File::create(path).map_err(|e| format!("creating {}: {e}", path.display()))?;
    f.write_all(bytes).map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(path.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both programs: every file, the man pages in roff naming a real flag, the completions naming the flags.
    #[test]
    fn writes_pages_and_completions_for_both_programs() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        for (program, flag) in
            [("runtime-proxy", "--remote-runtime-service-endpoint"), ("runtime-hooks", "--runtime-endpoint")]
        {
            let files = write_all(command(program).unwrap(), program, dir).unwrap();
            let read = |rel: &str| fs::read_to_string(dir.join(rel)).unwrap();
            let page = read(&format!("usr/share/man/man8/{program}.8"));
            assert!(page.contains(&format!(".TH {program} 8 ")), "{page:.300}");
            assert!(page.contains(&flag.replace('-', "\\-")), "{program}.8 does not name {flag}");
            assert!(page.contains(".SH \"SEE ALSO\""));
            let status = read(&format!("usr/share/man/man8/{program}-status.8"));
            assert!(status.contains("\\-\\-timeout"), "{program}-status.8 names status's --timeout");
            let bash = read(&format!("usr/share/bash-completion/completions/{program}"));
            assert!(bash.contains(flag));
            // every subcommand state the words loop sets has its case arm (the status subcommand's options)
            let states: Vec<&str> = bash
                .lines()
                .filter_map(|l| l.trim().strip_prefix("cmd=\"")?.strip_suffix('"'))
                .filter(|s| !s.is_empty())
                .collect();
            assert!(states.iter().any(|s| s.ends_with("__subcmd__status")), "{states:?}");
            for state in states {
                assert!(bash.lines().any(|l| l.trim() == format!("{state})")), "no case arm for {state}");
            }
            assert!(read(&format!("usr/share/zsh/vendor-completions/_{program}")).contains(flag));
            assert!(read(&format!("usr/share/fish/vendor_completions.d/{program}.fish"))
                .contains(flag.trim_start_matches('-')));
            assert_eq!(files.len(), 5, "{files:?}");
        }
    }

    #[test]
    fn unknown_program_and_unwritable_destination() {
        assert!(command("koord-runtime-proxy").is_none());
        let err =
            write_all(command("runtime-proxy").unwrap(), "runtime-proxy", Path::new("/proc/version/x")).unwrap_err();
        assert!(err.contains("/proc/version/x/usr/share/man/man8"), "{err}");
    }
}
