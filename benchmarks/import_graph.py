# The project's import graph (modules, lines, arrows, levels) with its cycles and its upward imports (a
# layer importing a later one); tests/test_import_all.py fails on either, this prints them for a note.
"""Usage: python benchmarks/import_graph.py [TREE] [--runtime] [--json]

TREE is a metax-audit checkout (default: this one). Every import of metax_audit/ (with metax_audit/probes/) counts:
module level, inside functions, and under `if TYPE_CHECKING:` (an annotation that names a later layer
is a dependency on it too; --runtime leaves those out). Prints the modules, their lines, the arrows,
the levels (the longest chain of imports, in modules), the modules over about 600 lines, every cycle
and every upward import, in the layer order LAYERS: core at the bottom, the cache store above it, the
stages in pipeline order (docs/architecture.md; dataflow records the facts that checks judge, so it
comes first), the reports, the pipeline that runs them, the CLI on top. A module imports its own layer
and the layers below it only.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

PACKAGES = ("metax_audit",)  # metax_audit/probes/ is one of its packages
# Data trees bundled as package data (the demo port, upstream and stub stack) are not project code.
NOT_CODE = (Path("metax_audit") / "demo" / "data",)
LAYERS = ("core", "cache", "snapshot", "discover", "upstream", "trace", "introspect", "compare", "dataflow",
          "checks", "probing", "triage", "inventory", "report", "pipeline", "cli")
# Where a module's layer is not its folder under metax_audit/ (or metax_audit/stages/):
ALIASES = {
    "metax_audit": "core",  # the package itself: the version and the core records it re-exports
    "stages": "core",  # metax_audit/stages/__init__.py: a comment, imports nothing
    "__main__": "cli",
    "demo": "cli",  # the demo command's port and upstream
    "introspect_worker": "introspect",  # the worker the introspect stage runs in the target interpreter
    "probes": "probing",  # the probe families the probing stage runs (metax_audit.probes or top-level probes)
    "switched_off": "triage",  # triage's off-switch demotion (stages/switched_off.py)
    "never_taken": "triage",  # triage's never-taken-branch demotion (stages/never_taken.py)
}
LONG_MODULE = 600


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> its file, for every module of the project's packages under `root`."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if any(path.is_relative_to(root / d) for d in NOT_CODE):
                continue
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def import_graph(root: Path, *, typing_imports: bool = True) -> dict[str, set[str]]:
    """module -> the project modules it imports (with `typing_imports`, those under TYPE_CHECKING too)."""
    files = module_files(root)
    graph: dict[str, set[str]] = {m: set() for m in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typing_only = set() if typing_imports else {
            id(n) for guard in ast.walk(tree) if isinstance(guard, ast.If)
            and ast.unparse(guard.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
            for stmt in guard.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join([*parts[: len(parts) - node.level + 1], *([node.module] if node.module else [])])
                targets = [base, *(f"{base}.{a.name}" for a in node.names)]
            else:
                continue
            for target in targets:
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each cycle a depth-first walk meets, as `a -> b -> a` (iterative: no recursion limit)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    found: list[str] = []
    for start in sorted(graph):
        if start in state:
            continue
        state[start] = 1
        path = [start]
        stack = [iter(sorted(graph[start]))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                found.append(" -> ".join([*path[path.index(nxt):], nxt]))
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return found


def layer(module: str) -> str | None:
    """The layer of a module: its folder under metax_audit/ (a stage's under metax_audit/stages/), or
    ALIASES; None for a module of no known layer (a new top-level package: give it one here)."""
    parts = module.split(".")
    if parts[0] == "probes":
        return ALIASES["probes"]
    if parts[:2] == ["metax_audit", "stages"] and len(parts) > 2:
        parts = [parts[0], *parts[2:]]
    key = parts[1] if len(parts) > 1 else parts[0]
    key = ALIASES.get(key, key)
    return key if key in LAYERS else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """`a -> b` where b's layer comes after a's: a lower layer reaching into a higher one."""
    return [f"{a} -> {b}" for a, targets in sorted(graph.items()) for b in sorted(targets)
            if (la := layer(a)) is not None and (lb := layer(b)) is not None and LAYERS.index(lb) > LAYERS.index(la)]


def unplaced(graph: dict[str, set[str]]) -> list[str]:
    """Modules of no layer: the upward check cannot judge them."""
    return sorted(m for m in graph if layer(m) is None)


def levels(graph: dict[str, set[str]]) -> int:
    """The longest chain of imports, in modules (a cycle's modules count as one)."""
    depth: dict[str, int] = {}
    on_path: set[str] = set()
    for start in sorted(graph):
        stack = [(start, iter(sorted(graph[start])))]
        on_path.add(start)
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                on_path.discard(node)
                depth[node] = 1 + max((depth.get(t, 0) for t in graph[node] if t not in on_path), default=0)
            elif nxt not in depth and nxt not in on_path:
                on_path.add(nxt)
                stack.append((nxt, iter(sorted(graph[nxt]))))
    return max(depth.values(), default=0)


def summary(root: Path, *, typing_imports: bool = True) -> dict[str, object]:
    files = module_files(root)
    graph = import_graph(root, typing_imports=typing_imports)
    lines = {m: len(p.read_text(encoding="utf-8").splitlines()) for m, p in files.items()}
    return {
        "modules": len(files),
        "lines": sum(lines.values()),
        "arrows": sum(len(t) for t in graph.values()),
        "levels": levels(graph),
        "top_level": sorted(p.name for p in (root / "metax_audit").iterdir() if p.name != "__pycache__"),
        "over_600": {m: n for m, n in sorted(lines.items(), key=lambda kv: -kv[1]) if n > LONG_MODULE},
        "cycles": cycles(graph),
        "upward_imports": upward_imports(graph),
        "unplaced": unplaced(graph),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", nargs="?", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--runtime", action="store_true", help="leave out the imports under TYPE_CHECKING")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    args = parser.parse_args(argv)
    if not (args.tree / "metax_audit").is_dir():
        print(f"error: {args.tree} is not a metax-audit checkout (no metax_audit/ in it)", file=sys.stderr)
        return 2
    data = summary(args.tree.resolve(), typing_imports=not args.runtime)
    if args.json:
        print(json.dumps(data, indent=1))
        return 0
    top = data["top_level"]
    assert isinstance(top, list)
    print(f"{data['modules']} modules, {data['lines']} lines, {data['arrows']} arrows, {data['levels']} levels")
    print(f"metax_audit/ holds {len(top)} entries: {' '.join(top)}")
    over = data["over_600"]
    assert isinstance(over, dict)
    print(f"over {LONG_MODULE} lines: " + (", ".join(f"{m} {n}" for m, n in over.items()) or "none"))
    for key in ("cycles", "upward_imports", "unplaced"):
        items = data[key]
        assert isinstance(items, list)
        print(f"{key.replace('_', ' ')}: {len(items)}")
        for item in items:
            print(f"  {item}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
