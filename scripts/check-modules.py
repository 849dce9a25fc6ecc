#!/usr/bin/env python3
"""check-modules.py [CRATE_SRC ...] — the module graph of each crate has no import cycle.

A node is a source file (a module: `a/b.rs` or `a/b/mod.rs` is `crate::a::b`). A file depends on
another when its non-test code names it: `use crate::a::b::X`, `crate::a::b::f()`, `super::X`,
`self::x::Y`, `use super::b` ... (each path resolved to the longest module that has a file).
What does not count:

* test code: `*_tests.rs` files and `#[cfg(test)] mod tests { ... }` blocks (tests may reach anywhere);
* a parent's `mod child;` and `pub use child::...` re-exports: a module that is a facade over its
  children is how Rust lays out a folder, not a dependency of the parent's own code on them;
* a child naming its parent's own items (`super::X` defined in `mod.rs`) is a dependency like any other.

Prints each cycle (a strongly connected component of more than one file) with one edge of it per line
and the line that makes it, and exits 1; prints `check-modules: no import cycle` and exits 0 otherwise.
Default crates: crates/runtime-proxy/src and crates/runtime-hooks/src.
"""
import os
import re
import sys

PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+|::\{)")
USE_GROUP = re.compile(r"\buse\s+(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*)\}", re.S)


def modules(src):
    """{module path tuple: file} for every .rs file under src."""
    mods = {}
    for d, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(d, f), src)[:-3].split(os.sep)
            if rel[-1] in ("mod", "lib", "main"):
                rel = rel[:-1]
            if rel and rel[-1].endswith("_tests"):
                continue
            mods[tuple(rel)] = os.path.join(d, f)
    return mods


def strip_tests(text):
    """The text without `#[cfg(test)]` items (a `mod x { ... }` block or a `mod x;` line), comments and strings."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'\br(#*)"(?:.|\n)*?"\1', '""', text)  # raw strings
    text = re.sub(r"'(?:\\.|[^\\'\n])'", "' '", text)  # char literals (not lifetimes)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    out, i = [], 0
    while True:
        j = text.find("#[cfg(test)]", i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:j])
        k = j + len("#[cfg(test)]")
        semi, brace = text.find(";", k), text.find("{", k)
        if brace < 0 or (0 <= semi < brace):
            i = semi + 1
            continue
        depth, k = 0, brace
        while k < len(text):
            depth += {"{": 1, "}": -1}.get(text[k], 0)
            k += 1
            if depth == 0:
                break
        i = k


def resolve(mods, here, is_dir_mod, head, rest):
    """The module a path names: the longest prefix with a file."""
    if head == "crate":
        base = ()
    elif head == "self":
        base = here
    else:  # super
        base = here[:-1]
    parts = [p for p in rest.split("::") if p]
    while parts and parts[0] == "super":
        base, parts = base[:-1], parts[1:]
    full = base + tuple(parts)
    for n in range(len(full), -1, -1):
        if full[:n] in mods:
            return full[:n]
    return None


def resolve_at(mods, mod, is_dir, head, rest):
    """The module `head rest` names, written in `mod` (a mod.rs's `self` is its own folder)."""
    if is_dir and head in ("self", "super"):
        base = mod if head == "self" else mod[:-1]
        return resolve(mods, mod, is_dir, "crate", "::".join(base) + rest)
    return resolve(mods, mod, is_dir, head, rest)


def add(found, mod, target, no, line):
    if target is not None and target != mod:
        found.setdefault(target, (no, line))


def edges(mods):
    out = {}
    for mod, path in mods.items():
        text = strip_tests(open(path, encoding="utf-8").read())
        is_dir = os.path.basename(path) in ("mod.rs", "lib.rs", "main.rs")
        found = {}
        lines = text.split("\n")
        for no, line in enumerate(lines, 1):
            # a parent's re-export of its own children is not a dependency
            m = re.match(r"\s*pub(\([a-z]+\))?\s+use\s+(self::)?([a-z_0-9]+)::", line)
            if m and mod + (m.group(3),) in mods:
                continue
            for m in PATH.finditer(line):
                head, rest = m.group(1), m.group(2)
                if rest == "::{" or line.startswith("::{", m.end()):
                    continue  # a use group (`crate::a::{b, c}`): below, item by item
                add(found, mod, resolve_at(mods, mod, is_dir, head, rest), no, line.strip())
        if is_dir:  # a folder module's own code naming a child by its bare name: `child::f()`
            children = [c[-1] for c in mods if len(c) == len(mod) + 1 and c[: len(mod)] == mod]
            for no, line in enumerate(lines, 1):
                if re.match(r"\s*(pub(\([a-z]+\))?\s+)?(mod|use)\b", line):
                    continue  # declarations and (re-)exports
                for c in children:
                    if re.search(r"(?<![:\w])" + c + r"::", line):
                        add(found, mod, mod + (c,), no, line.strip())
        for m in USE_GROUP.finditer(text):
            head, prefix, group = m.group(1), m.group(2), m.group(3)
            no = text[: m.start()].count("\n") + 1
            for item in re.split(r"[,\s]+", re.sub(r"\{[^}]*\}", "", group)):
                item = item.split("::")[0].strip()
                if item and item != "self":
                    add(found, mod, resolve_at(mods, mod, is_dir, head, prefix + "::" + item), no, "use ..." + prefix + "::" + item)
        out[mod] = found
    return out


def sccs(graph):
    index, low, stack, on, res, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            res.append(comp)

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return res


def name(mod):
    return "crate" if not mod else "::".join(mod)


def self_test():
    """The checker finds the cycles it is for (so that a pass means something): a two-file cycle, a
    parent whose own code names a child that names the parent, and none where a parent only re-exports."""
    import tempfile
    cases = {
        "lib.rs": "mod a;\nmod b;\nmod p;\nmod q;\n",
        "a.rs": "use crate::b::B;\npub struct A;\n",
        "b.rs": "pub struct B(crate::a::A);\n",
        "p/mod.rs": "mod c;\npub struct P;\nfn f() { c::g(); }\n",
        "p/c.rs": "use super::P;\npub fn g() {}\n",
        "q/mod.rs": "mod d;\npub use d::D;\npub struct Q;\n",
        "q/d.rs": "pub struct D(super::Q);\n",
    }
    with tempfile.TemporaryDirectory() as src:
        for path, text in cases.items():
            os.makedirs(os.path.dirname(os.path.join(src, path)), exist_ok=True)
            with open(os.path.join(src, path), "w") as f:
                f.write(text)
        found = sorted(sorted(map(name, c)) for c in sccs(edges(modules(src))) if len(c) > 1)
    assert found == [["a", "b"], ["p", "p::c"]], f"check-modules.py self-test: found {found}"


def main():
    self_test()
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    crates = sys.argv[1:] or [os.path.join(root, "crates", c, "src") for c in ("runtime-proxy", "runtime-hooks")]
    bad = 0
    for src in crates:
        mods = modules(src)
        graph = edges(mods)
        for comp in sccs(graph):
            if len(comp) < 2:
                continue
            bad += 1
            members = set(comp)
            print(f"{os.path.relpath(src, root)}: a cycle of {len(comp)} modules: {', '.join(sorted(map(name, comp)))}")
            for a in sorted(comp):
                for b, (no, line) in sorted(graph[a].items()):
                    if b in members:
                        print(f"    {name(a)} -> {name(b)}   ({os.path.relpath(mods[a], root)}:{no}: {line[:90]})")
    if bad:
        print(f"check-modules: {bad} import cycle(s)")
        return 1
    print("check-modules: no import cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
