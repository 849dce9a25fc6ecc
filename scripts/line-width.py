#!/usr/bin/env python3
"""line-width.py [--fix] [--width N] — the repository's one line width (120 columns) for code and prose.

Checks every tracked file of the kinds below and prints each line over the width that no exception covers;
exit 1 if any. With --fix it first re-wraps the prose it can (comment paragraphs in Rust and proto files,
Markdown paragraphs and list items), touching only paragraphs that hold a line over the width; `#` comments
of scripts are left to the author (a heredoc's `#` lines are not comments).

What is checked, and the exceptions (text that cannot be broken without breaking its meaning or a grep):
- Rust (rustfmt's max_width is the same width): a line may pass it only where a string literal or a URL does
  (user-visible messages stay whole so that grep finds them).
- Markdown: table rows, lines inside fenced code blocks, and a line whose overflow is one unbreakable word
  (a URL, a long path) are exempt.
- Shell, Python, TOML, YAML, proto: comment lines are checked; code lines of shell scripts are not (a command
  line broken with backslashes is no easier to read).
Not checked: vendor/, fuzz corpora, JSON and lock files (data).
"""
import re
import subprocess
import sys

WIDTH = 120
HASH_COMMENT = {".sh", ".py", ".toml", ".yaml", ".yml", ".mk"}
LIST_ITEM = re.compile(r"^(\s*)([-*+]|\d+[.)])(\s+)")


def tracked_files():
    out = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout.split("\n")
    for path in out:
        if not path or path.startswith(("vendor/", "fuzz/corpus/")) or "/fixtures/" in path:
            continue
        if path.endswith((".json", ".lock", ".pem")):
            continue
        yield path


def kind(path):
    if path.endswith(".rs"):
        return "rust"
    if path.endswith(".md"):
        return "md"
    if path.endswith(".proto"):
        return "proto"
    if path == "Makefile" or any(path.endswith(e) for e in HASH_COMMENT):
        return "hash"
    return None


UNBROKEN = re.compile(r"!?\[[^\]]*\]\([^)\s]*\)|`[^`]{1,60}`")


def words_of(texts):
    """The words of a paragraph; a Markdown link or a short code span stays one word (a link split over two lines
    is still a link, but harder to read and to grep)."""
    text = " ".join(texts)
    text = UNBROKEN.sub(lambda m: m.group(0).replace(" ", "\0"), text)
    return [w.replace("\0", " ") for w in text.split()]


def wrap_words(words, first_prefix, rest_prefix, width):
    """Greedy wrap: words (no spaces inside) onto lines; a word longer than a line stands alone."""
    lines, current = [], first_prefix
    empty = True
    for w in words:
        if empty:
            current += w
            empty = False
        elif len(current) + 1 + len(w) <= width:
            current += " " + w
        else:
            lines.append(current)
            current = rest_prefix + w
    lines.append(current)
    return lines


def reflow_paragraphs(paragraphs, width):
    """paragraphs: list of (first_prefix, rest_prefix, [texts], original_lines, wrappable)."""
    out = []
    for first, rest, texts, original, wrappable in paragraphs:
        if wrappable and any(len(line) > width for line in original):
            words = words_of(texts)
            out.extend(wrap_words(words, first, rest, width))
        else:
            out.extend(original)
    return out


def comment_groups(lines, marker_re):
    """Splits lines into runs: (is_comment_run, prefix, [lines])."""
    runs = []
    for line in lines:
        m = marker_re.match(line)
        key = m.group(1) if m else None
        if runs and runs[-1][0] == (m is not None) and runs[-1][1] == key:
            runs[-1][2].append(line)
        else:
            runs.append((m is not None, key, [line]))
    return runs


def paragraphs_of(prefix, lines, width, markdown_in_comments=True):
    """Paragraphs of a comment run whose lines all start with `prefix` (e.g. '    /// ')."""
    paras, fence, cur = [], False, None

    def close():
        nonlocal cur
        if cur:
            paras.append(cur)
        cur = None

    for line in lines:
        body = line[len(prefix):] if line.startswith(prefix) else line[len(prefix.rstrip()):]
        stripped = body.strip()
        if stripped.startswith("```"):
            close()
            fence = not fence
            paras.append((None, None, [], [line], False))
            continue
        if fence or not stripped or stripped.startswith(("|", "#", "<", "=")) or body.startswith("    ") and cur is None:
            close()
            paras.append((None, None, [], [line], False))
            continue
        item = LIST_ITEM.match(body) if markdown_in_comments else None
        if item:
            close()
            hang = " " * len(item.group(0))
            cur = (prefix + item.group(0), prefix + hang, [body[len(item.group(0)):]], [line], True)
            continue
        if cur is not None:
            lead = len(body) - len(body.lstrip())
            if lead and lead != len(cur[1]) - len(prefix):
                close()
                paras.append((None, None, [], [line], False))
                continue
            cur[2].append(stripped)
            cur[3].append(line)
            continue
        lead = body[: len(body) - len(body.lstrip())]
        cur = (prefix + lead, prefix + lead, [stripped], [line], True)
    close()
    return paras


def fix_comments(text, marker_re, width):
    lines = text.split("\n")
    out = []
    for is_comment, key, run in comment_groups(lines, marker_re):
        if not is_comment:
            out.extend(run)
            continue
        prefix = key + " "
        out.extend(reflow_paragraphs(paragraphs_of(prefix, run, width), width))
    return "\n".join(out)


RUST_COMMENT = re.compile(r"^(\s*(?://!|///|//))(?: |$)")
HASH_COMMENT_RE = re.compile(r"^(\s*#)(?: |$)(?!!)")


def fix_markdown(text, width):
    lines = text.split("\n")
    out, i, fence = [], 0, False
    block = []

    def flush():
        if block:
            out.extend(reflow_paragraphs(markdown_paragraphs(block), width))
            block.clear()

    for line in lines:
        if line.lstrip().startswith("```"):
            flush()
            fence = not fence
            out.append(line)
            continue
        if fence:
            out.append(line)
            continue
        block.append(line)
    flush()
    return "\n".join(out)


def markdown_paragraphs(lines):
    paras, cur = [], None

    def close():
        nonlocal cur
        if cur:
            paras.append(cur)
        cur = None

    for line in lines:
        s = line.strip()
        quote = re.match(r"^(>\s?)+", line)
        prefix = quote.group(0) if quote else ""
        body = line[len(prefix):]
        if not s or s.startswith(("|", "#", "<", "[!")) or re.match(r"^\[[^\]]+\]:", s) or set(s) <= set("-=*_ "):
            close()
            paras.append((None, None, [], [line], False))
            continue
        item = LIST_ITEM.match(body)
        if item:
            close()
            cur = [prefix + item.group(0), prefix + " " * len(item.group(0)), [body[len(item.group(0)):]], [line], True]
            continue
        lead = len(body) - len(body.lstrip())
        if cur is not None and cur[0].startswith(prefix) and (lead == len(cur[1]) - len(prefix) or (lead == 0 and cur[1] == prefix)):
            cur[2].append(body.strip())
            cur[3].append(line)
            continue
        close()
        if lead >= 4 and not prefix:
            paras.append((None, None, [], [line], False))
            continue
        cur = [prefix + body[:lead], prefix + body[:lead], [body.strip()], [line], True]
    close()
    return [tuple(p) for p in paras]


def exempt(k, line, in_fence):
    if len(line) <= WIDTH:
        return True
    s = line.strip()
    if k == "md":
        if in_fence or s.startswith("|") or s.startswith("<"):
            return True
        words = line.split()
        return bool(words) and len(line) - len(words[-1]) <= WIDTH + 1 or "http" in line and len(words) <= 3
    if k == "rust":
        if re.match(r"^\s*//[/!]?\s*\|", line):
            return True  # a table row in a doc comment
        if '"' in line or line.rstrip().endswith("\\"):
            first_quote = line.find('"')
            return first_quote == -1 or first_quote < WIDTH or line.rstrip().endswith("\\")
        return "http://" in line or "https://" in line
    if k in ("hash", "proto"):
        comment = s.startswith("#") if k == "hash" else s.startswith("//")
        if not comment:
            return True
        return "http" in line or len(line.split()) <= 2
    return True


def main():
    global WIDTH
    args = sys.argv[1:]
    fix = "--fix" in args
    if "--width" in args:
        WIDTH = int(args[args.index("--width") + 1])
    bad = 0
    for path in tracked_files():
        k = kind(path)
        if k is None:
            continue
        try:
            text = open(path, encoding="utf-8").read()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        if fix:
            new = text
            if k == "rust":
                new = fix_comments(text, RUST_COMMENT, WIDTH)
            elif k == "proto":
                new = fix_comments(text, RUST_COMMENT, WIDTH)
            elif k == "md":
                new = fix_markdown(text, WIDTH)
            if new != text:
                open(path, "w", encoding="utf-8").write(new)
                text = new
        fence = False
        for n, line in enumerate(text.split("\n"), 1):
            if k == "md" and line.lstrip().startswith("```"):
                fence = not fence
                continue
            if not exempt(k, line, fence):
                bad += 1
                print(f"{path}:{n}: {len(line)} columns: {line.strip()[:80]}…")
    if bad:
        print(f"{bad} lines over {WIDTH} columns (scripts/line-width.py --fix re-wraps prose; code: break it)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
