# Every module of metax_audit/ (metax_audit/probes/ too) imports: a module that does not import fails here by
# name, instead of surfacing as a skipped test or as a probe family missing from the registry.
from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("metax_audit",)  # metax_audit/probes/ is one of its packages
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
    assert {"metax_audit", "metax_audit.pipeline.review", "metax_audit.stages.checks", "metax_audit.probes", "metax_audit.probes.registry"} <= set(MODULES)
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
    from metax_audit.probes.registry import registry

    assert registry().broken == {}


# The import graph, its cycles and its upward imports come from benchmarks/import_graph.py (which prints
# them for a note). Its LAYERS are the package map of docs/architecture.md: core, the cache store, the
# stages in pipeline order, report, pipeline, cli. A module imports its own layer and the ones below only,
# and no import (one under TYPE_CHECKING included) closes a cycle.
def _graph_tool():
    import importlib.util

    spec = importlib.util.spec_from_file_location("import_graph", REPO / "benchmarks" / "import_graph.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GRAPH = _graph_tool()


def test_the_graph_walks_the_same_modules() -> None:
    assert set(GRAPH.module_files(REPO)) == set(MODULES)


def test_no_import_cycle() -> None:
    assert GRAPH.cycles(GRAPH.import_graph(REPO)) == []


def test_no_layer_imports_a_later_layer() -> None:
    assert GRAPH.upward_imports(GRAPH.import_graph(REPO)) == []


def test_no_stage_imports_the_cache() -> None:
    """Stages are functions of their inputs: what is kept between reviews reaches them from the pipeline
    (a core.memo.Memo, the kept snapshots), never by importing metax_audit.cache (issue 32)."""
    graph = GRAPH.import_graph(REPO)
    assert [f"{a} -> {b}" for a, targets in sorted(graph.items()) if a.startswith("metax_audit.stages")
            for b in sorted(targets) if b == "metax_audit.cache" or b.startswith("metax_audit.cache.")] == []


def test_every_module_has_a_layer() -> None:
    """A new top-level package must be placed in import_graph.LAYERS (or ALIASES), else the upward
    check cannot judge its imports."""
    assert GRAPH.unplaced(GRAPH.import_graph(REPO)) == []


def test_the_top_level_stays_small() -> None:
    """metax_audit/ shows the pipeline: the core, the stages, the cache, the reports, the pipeline and
    the CLI (issue 32: at most about ten entries); a new module goes into one of them."""
    top = {p.name for p in (REPO / "metax_audit").iterdir() if p.name != "__pycache__"}
    assert top <= {"__init__.py", "__main__.py", "py.typed", "core", "cache", "stages", "pipeline", "report", "cli",
                   "demo", "probes"}, top


def test_the_graph_tool_finds_a_cycle_and_an_upward_import(tmp_path: Path) -> None:
    from conftest import write_tree

    write_tree(tmp_path, {
        "metax_audit/__init__.py": "",
        "metax_audit/core/__init__.py": "",
        "metax_audit/core/models.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                      "    from metax_audit.pipeline import review\n",
        "metax_audit/stages/__init__.py": "",
        "metax_audit/stages/discover.py": "from metax_audit import report\nfrom metax_audit.stages import snapshot\n",
        "metax_audit/stages/snapshot.py": "from metax_audit.core import models\n",
        "metax_audit/report/__init__.py": "",
        "metax_audit/report/markdown.py": "def f():\n    from metax_audit.report.json_report import render\n",
        "metax_audit/report/json_report.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                             "    from metax_audit.stages import discover\nfrom .markdown import f\n",
        "metax_audit/pipeline/__init__.py": "",
        "metax_audit/pipeline/review.py": "from metax_audit.stages import discover\n",
        "metax_audit/newthing.py": "",
        "metax_audit/probes/__init__.py": "from metax_audit.stages import snapshot\n",
    })
    graph = GRAPH.import_graph(tmp_path)
    assert GRAPH.cycles(graph) == [
        "metax_audit.core.models -> metax_audit.pipeline.review -> metax_audit.stages.discover -> "
        "metax_audit.stages.snapshot -> metax_audit.core.models",
        "metax_audit.report.json_report -> metax_audit.report.markdown -> metax_audit.report.json_report",
    ]
    assert GRAPH.upward_imports(graph) == ["metax_audit.core.models -> metax_audit.pipeline",
                                           "metax_audit.core.models -> metax_audit.pipeline.review",
                                           "metax_audit.stages.discover -> metax_audit.report"]
    assert GRAPH.unplaced(graph) == ["metax_audit.newthing"]
    # a TYPE_CHECKING import never runs, but it is a dependency all the same: --runtime leaves it out
    runtime = GRAPH.import_graph(tmp_path, typing_imports=False)
    assert GRAPH.cycles(runtime) == ["metax_audit.report.json_report -> metax_audit.report.markdown -> "
                                     "metax_audit.report.json_report"]  # an import inside a function runs
    assert GRAPH.upward_imports(runtime) == ["metax_audit.stages.discover -> metax_audit.report"]
    assert GRAPH.levels(runtime) == 4  # pipeline.review -> stages.discover -> stages.snapshot -> core.models
