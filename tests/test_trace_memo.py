# The trace memo: a backend's chain and a file's context-free call sites are served again only
# while every port file and folder they read is unchanged, and what is served is exactly what
# tracing again gives (each unit resolves with its own resolver).
from __future__ import annotations

import shutil
from pathlib import Path

from metax_audit import demo
from metax_audit.cache.memo import review_memo
from metax_audit.core.config import AuditConfig
from metax_audit.stages import discover as discover_mod
from metax_audit.stages.trace import trace_backends
from metax_audit.stages.trace.memo import MemoCount, TraceMemo, UnitResult
from metax_audit.stages.trace.modules import ModuleIndex

CONFIG = AuditConfig()
FLASHINFER = "vllm_metax/v1/attention/backends/flashinfer.py"


def _port(tmp_path: Path) -> Path:
    root = tmp_path / "port"
    shutil.copytree(demo.port_root(), root)
    return root


def _trace(root: Path, memo: bool, count: MemoCount | None = None):
    disc = discover_mod.discover(root, CONFIG)
    return trace_backends(disc, CONFIG, demo.upstream_root(), memo_common=["test"] if memo else None, memo_count=count,
                         memo=review_memo(memo))


def test_a_second_trace_is_served_whole_and_equals_a_fresh_one(tmp_path: Path) -> None:
    root = _port(tmp_path)
    first_count, second_count = MemoCount(), MemoCount()
    first = _trace(root, True, first_count)
    second = _trace(root, True, second_count)
    assert first_count.served == {} and first_count.computed["backend"] == len(first.backends) >= 2
    assert second_count.computed == {}
    assert second_count.served == first_count.computed
    assert first == second == _trace(root, False)


def test_an_edited_backend_file_retraces_what_read_it_only(tmp_path: Path) -> None:
    root = _port(tmp_path)
    _trace(root, True)
    path = root / FLASHINFER
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines, "", "", "def _helper_added_by_the_change():", "    return len([1, 2])", ""]))
    count = MemoCount()
    again = _trace(root, True, count)
    assert again == _trace(root, False)
    assert count.computed["backend"] >= 1 and count.served.get("backend", 0) >= 1  # TRITON_ATTN never reads flashinfer.py
    assert count.computed["scope"] == 1  # the edited file's own call sites
    added = len(lines) + 4
    assert any(c.location.path == FLASHINFER and c.location.line == added and c.callee_text == "len" for c in again.calls)


def test_a_name_that_was_missing_and_now_exists_is_read_again(tmp_path: Path) -> None:
    pkg = tmp_path / "vllm_metax"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    calls: list[bool] = []

    def unit(index: ModuleIndex) -> tuple[bool, UnitResult]:
        def compute() -> tuple[bool, UnitResult]:
            calls.append(True)
            return index.get("vllm_metax.later") is not None, UnitResult(frozenset(), frozenset(), ())

        memo = TraceMemo(index, ["test"], memo=review_memo(True))
        return memo.unit(["probe"], compute)[0]

    def index() -> ModuleIndex:
        return ModuleIndex(tmp_path, "vllm_metax", None, "vllm")

    assert unit(index()) is False and unit(index()) is False
    assert len(calls) == 1  # served while vllm_metax/later.py does not exist
    (pkg / "later.py").write_text("X = 1\n")
    assert unit(index()) is True and len(calls) == 2
    (pkg / "later.py").write_text("X = 2\n")
    assert unit(index()) is True and len(calls) == 3  # its bytes are part of the state
    assert unit(index()) is True and len(calls) == 3


def test_a_skipped_file_met_by_a_served_unit_is_still_reported(tmp_path: Path) -> None:
    root = _port(tmp_path)
    (root / "vllm_metax/v1/attention/ops/merge_attn_states.py").write_text("def broken(:\n")
    first = _trace(root, True)
    count = MemoCount()
    second = _trace(root, True, count)
    assert count.computed == {}
    assert first == second
    assert any(u.location.path.endswith("merge_attn_states.py") and "syntax error" in u.reason for u in second.unresolved)
