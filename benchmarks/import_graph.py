# The project's import graph (modules, lines, arrows) with its cycles and its backward edges (a stage
# importing a later stage); tests/test_import_all.py fails on either, this prints them for a note.
"""Usage: python benchmarks/import_graph.py [TREE] [--json]

TREE is a metax-audit checkout (default: this one). Every runtime import of metax_audit/ and probes/
counts, module level and inside functions; an `if TYPE_CHECKING:` import only serves annotations and
never runs, so it is left out. Prints the modules, their lines, the arrows, the modules over about
600 lines, every cycle and every import of a later stage by an earlier one, in the stage order
STAGES (DESIGN.md's data flow; dataflow records the facts that checks judge, so it comes first).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

PACKAGES = ("metax_audit", "probes")
# Data trees bundled as package data (the demo port, upstream and stub stack) are not project code.
NOT_CODE = (Path("metax_audit") / "demo" / "data",)
STAGES = ("snapshot", "discover", "upstream", "trace", "introspect", "compare", "dataflow", "checks", "probing",
          "inventory", "report")
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


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the project modules it imports when it runs."""
    files = module_files(root)
    graph: dict[str, set[str]] = {m: set() for m in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typing_only = {id(n) for guard in ast.walk(tree) if isinstance(guard, ast.If)
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


def stage(module: str) -> int | None:
    parts = module.split(".")
    if parts[:2] == ["metax_audit", "stages"]:  # a stage is metax_audit.stages.NAME
        parts = [parts[0], *parts[2:]]
    return STAGES.index(parts[1]) if parts[0] == "metax_audit" and len(parts) > 1 and parts[1] in STAGES else None


def backward_edges(graph: dict[str, set[str]]) -> list[str]:
    """`a -> b` where a's stage comes before b's: an earlier stage reaching into a later one."""
    return [f"{a} -> {b}" for a, targets in sorted(graph.items()) for b in sorted(targets)
            if (sa := stage(a)) is not None and (sb := stage(b)) is not None and sb > sa]


def summary(root: Path) -> dict[str, object]:
    files = module_files(root)
    graph = import_graph(root)
    lines = {m: len(p.read_text(encoding="utf-8").splitlines()) for m, p in files.items()}
    return {
        "modules": len(files),
        "lines": sum(lines.values()),
        "arrows": sum(len(t) for t in graph.values()),
        "over_600": {m: n for m, n in sorted(lines.items(), key=lambda kv: -kv[1]) if n > LONG_MODULE},
        "cycles": cycles(graph),
        "backward_edges": backward_edges(graph),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", nargs="?", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    args = parser.parse_args(argv)
    if not (args.tree / "metax_audit").is_dir():
        print(f"error: {args.tree} is not a metax-audit checkout (no metax_audit/ in it)", file=sys.stderr)
        return 2
    data = summary(args.tree.resolve())
    if args.json:
        print(json.dumps(data, indent=1))
        return 0
    print(f"{data['modules']} modules, {data['lines']} lines, {data['arrows']} arrows")
    over = data["over_600"]
    assert isinstance(over, dict)
    print(f"over {LONG_MODULE} lines: " + (", ".join(f"{m} {n}" for m, n in over.items()) or "none"))
    for key in ("cycles", "backward_edges"):
        items = data[key]
        assert isinstance(items, list)
        print(f"{key.replace('_', ' ')}: {len(items)}")
        for item in items:
            print(f"  {item}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
