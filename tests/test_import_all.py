# Every module of metax_audit/ and probes/ imports: a module that does not import fails here by
# name, instead of surfacing as a skipped test or as a probe family missing from the registry.
from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("metax_audit", "probes")
# Data trees bundled as package data (the demo port, upstream and stub stack) are not project code.
NOT_CODE = (REPO / "metax_audit" / "demo" / "data",)


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if any(path.is_relative_to(d) for d in NOT_CODE):
                continue
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.append(".".join(parts))
    return names


MODULES = _modules()


def test_the_walk_finds_the_packages_and_their_stages() -> None:
    assert {"metax_audit", "metax_audit.pipeline", "metax_audit.checks", "probes", "probes.registry"} <= set(MODULES)
    assert not any(".data." in m for m in MODULES)


@pytest.mark.parametrize("name", [m for m in MODULES if not m.endswith(".__main__")])
def test_module_imports(name: str) -> None:
    importlib.import_module(name)


@pytest.mark.parametrize("name", [m for m in MODULES if m.endswith(".__main__")])
def test_main_module_compiles_and_its_imports_resolve(name: str) -> None:
    """`__main__` runs a CLI when imported, so it is compiled and its top-level imports are imported."""
    import ast

    path = REPO / Path(*name.split(".")).with_suffix(".py")
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    compile(tree, str(path), "exec")
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), (
                    f"{name}: {node.module} has no {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)


def test_probe_registry_has_no_broken_module() -> None:
    """The registry keeps a module that fails to import as data (so one broken family does not hide
    the others at run time); in the project's own tree that is a bug."""
    from probes.registry import registry

    assert registry().broken == {}


# The stages in data-flow order (DESIGN.md); a module of one stage never imports a later one.
# The dataflow stage records facts that checks/lse.py and checks/scales.py judge, so it comes first.
STAGES = ("snapshot", "discover", "upstream", "trace", "introspect", "compare", "dataflow", "checks", "probing",
          "inventory", "report")


def _import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports when it runs (module level and in functions; an
    `if TYPE_CHECKING:` import is for annotations only and never runs)."""
    import ast

    known = set(MODULES)
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for name in MODULES:
        path = REPO / Path(*name.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
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
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def _stage(module: str) -> int | None:
    parts = module.split(".")
    return STAGES.index(parts[1]) if parts[0] == "metax_audit" and len(parts) > 1 and parts[1] in STAGES else None


def test_no_import_cycle() -> None:
    graph = _import_graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[str] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt):], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_no_stage_imports_a_later_stage() -> None:
    forward = [f"{a} -> {b}" for a, targets in sorted(_import_graph().items()) for b in sorted(targets)
               if (sa := _stage(a)) is not None and (sb := _stage(b)) is not None and sb > sa]
    assert forward == []
