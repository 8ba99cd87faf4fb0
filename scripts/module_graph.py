#!/usr/bin/env python3
"""The crate's module graph from its sources, its import cycles and its imports that point up.

Every file under src/ is a node (`http/handler.rs` is `http::handler`,
`http.rs` or `http/mod.rs` is `http`). An edge is any path into the crate the file names:
`use crate::...` (brace groups expanded, however they are nested and
wrapped), `use super::...`, and `crate::a::b` written inline in code. A path
lands on the deepest module that exists (`crate::rpc::error::ApiError` is an
edge to `rpc::error`). Edges between a module and its own children or
parent do not count: a `mod.rs` declaring its files, a child using its
parent's items, are one module's private business.

The layer order is declared once, in the `layers:` block of the `//!` map
in src/lib.rs: top to bottom, one layer a line, its modules first on the
line (a module belongs to the longest one that names it or a parent). An
import may point to its own layer or below, never up.

    scripts/module_graph.py            # the edges, then the cycles and upward imports
    scripts/module_graph.py --check    # exit 1 on a cycle, an upward import or an undeclared module
    scripts/module_graph.py --ignore engine  # cycles outside engine's private files
    scripts/module_graph.py --no-tests       # without unit-test modules' imports

Python's standard library only.
"""

import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "src"


def module_of(path):
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    if parts and parts[0] in ("main", "bin"):
        return None  # binaries are leaves above the library
    return "::".join(parts)


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    # String literals may hold `crate::` in messages: drop their contents.
    text = re.sub(r'r#"(?:.|\n)*?"#', '""', text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return text


def expand_use_tree(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e']."""
    tree = re.sub(r"\s+", "", tree)
    out = []

    def walk(prefix, text):
        depth, start, items = 0, 0, []
        for i, ch in enumerate(text):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                items.append(text[start:i])
                start = i + 1
        items.append(text[start:])
        for item in items:
            if not item:
                continue
            brace = item.find("{")
            if brace >= 0 and item.endswith("}"):
                head = item[:brace].rstrip(":")
                walk(prefix + ([head] if head else []), item[brace + 1 : -1])
            else:
                item = item.split(" as ")[0]
                out.append("::".join(prefix + [item]))

    walk([], tree)
    return out


def inline_modules(code):
    """For each offset of `code`, the inline modules (`mod tests { ... }`)
    around it, as a function of the offset."""
    opened = []  # (name, brace depth inside it)
    spans = []  # (start, end, path)
    depth = 0
    pending = None
    for match in re.finditer(r"\bmod\s+([A-Za-z_][A-Za-z0-9_]*)\s*\{|[{}]", code):
        token = match.group(0)
        if token.startswith("mod"):
            depth += 1
            opened.append((match.group(1), depth, match.end()))
        elif token == "{":
            depth += 1
        else:
            if opened and opened[-1][1] == depth:
                name, _, start = opened.pop()
                spans.append((start, match.start(), [o[0] for o in opened] + [name]))
            depth -= 1
    del pending

    def at(offset):
        best = []
        for start, end, path in spans:
            if start <= offset < end and len(path) > len(best):
                best = path
        return best

    return at


def referenced_paths(module, text, tests=True):
    code = strip_comments(text)
    inline = inline_modules(code)
    paths = []
    for match in re.finditer(r"\buse\s+([^;]+);", code):
        for path in expand_use_tree(match.group(1)):
            paths.append((match.start(), path))
    # Inline paths outside `use` items.
    uses = [(m.start(), m.end()) for m in re.finditer(r"\buse\s+[^;]+;", code)]
    for match in re.finditer(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)", code):
        if any(start <= match.start() < end for start, end in uses):
            continue
        paths.append((match.start(), match.group(1) + match.group(2)))
    resolved = []
    for offset, path in paths:
        around = inline(offset)
        if not tests and any("test" in name for name in around):
            continue
        here = (module.split("::") if module else []) + around
        parts = path.split("::")
        if parts[0] == "crate":
            resolved.append(parts[1:])
        elif parts[0] == "super":
            base = list(here)
            while parts and parts[0] == "super":
                base = base[:-1]
                parts = parts[1:]
            resolved.append(base + parts)
        elif parts[0] == "self":
            resolved.append(here + parts[1:])
    return resolved


def graph(ignore, tests=True):
    files = {}
    for path in sorted(SRC.rglob("*.rs")):
        module = module_of(path)
        if module is None:
            continue
        if not tests and any("test" in part for part in module.split("::")):
            continue
        files[module] = path.read_text()
    modules = set(files)
    edges = {}
    for module, text in files.items():
        targets = set()
        for parts in referenced_paths(module, text, tests):
            target = None
            for n in range(len(parts), 0, -1):
                candidate = "::".join(parts[:n])
                if candidate in modules:
                    target = candidate
                    break
            if target is None or target == module:
                continue
            # A module and its own parent or children are one unit.
            if target.startswith(module + "::") or module.startswith(target + "::"):
                continue
            targets.add(target)
        edges[module] = targets
    if ignore:
        # Collapse each ignored module's private files into it.
        def collapse(name):
            for prefix in ignore:
                if name == prefix or name.startswith(prefix + "::"):
                    return prefix
            return name

        collapsed = {}
        for module, targets in edges.items():
            source = collapse(module)
            collapsed.setdefault(source, set()).update(
                collapse(target) for target in targets if collapse(target) != source
            )
        edges = collapsed
    return edges


def cycles(edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def connect(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(edges):
        if node not in index:
            connect(node)
    return out


def declared_layers():
    """The layer order of src/lib.rs: a list of lists of module names, top first."""
    lines = (SRC / "lib.rs").read_text().splitlines()
    start = lines.index("//! layers:")
    layers = []
    for line in lines[start + 1 :]:
        text = line.removeprefix("//!").strip()
        if text.startswith("```"):
            break
        names = re.split(r"\s{2,}", text)[0].split()
        if names:
            layers.append(names)
    return layers


def layer_of(module, layers):
    """The index of the layer `module` belongs to, or None."""
    best, best_len = None, -1
    for index, names in enumerate(layers):
        for name in names:
            if (module == name or module.startswith(name + "::")) and len(name) > best_len:
                best, best_len = index, len(name)
    return best


def upward(edges, layers):
    """Imports that point to a higher layer, and modules in no layer."""
    undeclared = sorted(m for m in edges if m and layer_of(m, layers) is None)
    up = []
    for module in sorted(edges):
        here = layer_of(module, layers)
        if here is None:
            continue
        for target in sorted(edges[module]):
            there = layer_of(target, layers)
            if there is not None and there < here:
                up.append((module, target))
    return up, undeclared


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 on a cycle, an import that points up or a module in no layer",
    )
    parser.add_argument(
        "--ignore", action="append", default=[], help="treat this module's files as one"
    )
    parser.add_argument(
        "--no-tests", action="store_true", help="leave out unit-test modules' imports"
    )
    args = parser.parse_args()
    edges = graph(args.ignore, tests=not args.no_tests)
    if not args.check:
        for module in sorted(edges):
            print(f"{module or 'crate'} -> {', '.join(sorted(edges[module])) or '(nothing)'}")
    found = cycles(edges)
    for component in found:
        inner = [
            f"{a} -> {b}" for a in component for b in sorted(edges[a]) if b in component
        ]
        print(f"CYCLE among {', '.join(component)}: {'; '.join(inner)}")
    if not found:
        print("no cycles")
    layers = declared_layers()
    up, undeclared = upward(edges, layers)
    for module, target in up:
        print(f"UP: {module} -> {target} points to a higher layer (src/lib.rs `layers:`)")
    for module in undeclared:
        print(f"UNDECLARED: {module} is in no layer of src/lib.rs `layers:`")
    if not up and not undeclared:
        print(f"imports point down {len(layers)} layers")
    failed = bool(found or up or undeclared)
    return 1 if (args.check and failed) else 0


if __name__ == "__main__":
    sys.exit(main())
