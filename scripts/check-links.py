#!/usr/bin/env python3
"""check-links.py: every relative link of the repository's Markdown must resolve.

For every *.md file of the repository (outside target/, fuzz/, .git/ and node_modules/), each inline
link or image `[text](path#anchor)` and each reference definition `[name]: path#anchor` whose target
is relative (no scheme such as https: or mailto:) must name a file or directory that exists,
relative to the file that links; an `#anchor` (alone: the same file) must be the slug of a heading
of the target Markdown file, by GitHub's rules: the heading's text as rendered (code spans, emphasis
and link targets stripped), lowercased, every character but letters, marks, digits, `_`, `-` and
spaces dropped, spaces turned into `-`, and a repeated slug suffixed `-1`, `-2`, ... Links inside
fenced code blocks and code spans are not links and are skipped.

Usage: scripts/check-links.py [ROOT] (default: the repository this script is in). Exit code 0 when
every link resolves; 1 with one line per broken link (`FILE:LINE: broken link TARGET: why`).
Python 3 standard library only.
"""

import os
import re
import sys
import unicodedata

SKIP_DIRS = {"target", "fuzz", ".git", "node_modules"}
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
# [text](target) or ![alt](target); target without spaces, optionally in <>, optional "title".
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFDEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def markdown_files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            if name.endswith(".md"):
                yield os.path.join(dirpath, name)


def lines_outside_fences(text):
    """(line number, line) for each line not inside a fenced code block."""
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                continue
            yield number, line
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line.strip()[len(m.group(1)):].strip():
            fence = None


def heading_text(raw):
    """A heading's text as GitHub renders it, for its slug."""
    text = re.sub(r"`+([^`]*)`+", r"\1", raw)  # code spans keep their content
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    return text.strip()


def slug(text):
    out = []
    for ch in text.lower():
        cat = unicodedata.category(ch)
        if ch in " -_" or cat[0] in "LMN" or cat == "Pc":
            out.append("-" if ch == " " else ch)
    return "".join(out)


def anchors(path, cache={}):
    if path not in cache:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        seen, result, previous = {}, set(), None
        for _, line in lines_outside_fences(text):
            m = ATX.match(line)
            raw = None
            if m:
                raw = m.group(2) or ""
            elif previous is not None and previous.strip() and SETEXT.match(line) and not ATX.match(previous):
                raw = previous.strip()
            previous = line
            if raw is None:
                continue
            base = slug(heading_text(raw))
            n = seen.get(base, 0)
            seen[base] = n + 1
            result.add(base if n == 0 else f"{base}-{n}")
        # explicit HTML anchors: <a name="x"> / id="x"
        for m in re.finditer(r"<a\s+(?:name|id)=\"([^\"]+)\"", text):
            result.add(m.group(1))
        cache[path] = result
    return cache[path]


def links(text):
    for number, line in lines_outside_fences(text):
        m = REFDEF.match(line)
        if m:
            yield number, m.group(1)
            continue
        stripped = CODE_SPAN.sub(lambda c: " " * len(c.group(0)), line)
        for m in INLINE.finditer(stripped):
            yield number, m.group(1)


def check(root):
    problems = []
    for path in markdown_files(root):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        rel = os.path.relpath(path, root)
        for number, target in links(text):
            if not target or SCHEME.match(target) or target.startswith("//"):
                continue
            file_part, _, anchor = target.partition("#")
            dest = path if not file_part else os.path.normpath(os.path.join(os.path.dirname(path), file_part))
            if not os.path.exists(dest):
                problems.append(f"{rel}:{number}: broken link {target}: {os.path.relpath(dest, root)} does not exist")
                continue
            if anchor and dest.endswith(".md") and os.path.isfile(dest):
                if anchor not in anchors(dest):
                    problems.append(
                        f"{rel}:{number}: broken link {target}: no heading with anchor #{anchor} in {os.path.relpath(dest, root)}"
                    )
    return problems


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    root = os.path.abspath(root)
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"check-links: {len(problems)} broken link(s)", file=sys.stderr)
        return 1
    print("check-links: every relative link resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
