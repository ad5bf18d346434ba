# The dataflow memo: each file's walk is served again only while what it read holds (its module
# files, the answers of its searches by name), and what is served equals walking again.
from __future__ import annotations

import shutil
from pathlib import Path

from metax_audit import demo
from metax_audit.cache.memo import review_memo
from metax_audit.core.contracts import project_contracts
from metax_audit.stages.dataflow.analysis import follow
from metax_audit.stages.dataflow.facts import DataflowFacts

MERGE = "vllm_metax/v1/attention/ops/merge_attn_states.py"
FLASHINFER = "vllm_metax/v1/attention/backends/flashinfer.py"


def _port(tmp_path: Path) -> Path:
    root = tmp_path / "port"
    shutil.copytree(demo.port_root(), root)
    return root


def _follow(root: Path, memo: bool) -> DataflowFacts:
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py"))
    contracts = project_contracts()
    assert contracts is not None
    return follow(root, files, contracts, port_package="vllm_metax", memo_common=["test"] if memo else None,
                  memo=review_memo(memo))


def _units(cache: Path) -> int:
    return len(list((cache / "results" / "dataflow-unit").glob("*.entry")))


def test_served_walks_equal_fresh_ones(tmp_path: Path, audit_cache: Path) -> None:
    root = _port(tmp_path)
    first = _follow(root, True)
    assert first.flows and _units(audit_cache) > 0  # the demo's FlashInfer flows are found and kept
    assert _follow(root, True) == first == _follow(root, False)


def test_an_edit_is_seen_by_the_walk_that_entered_the_edited_file(tmp_path: Path, audit_cache: Path) -> None:
    root = _port(tmp_path)
    before = _follow(root, True)
    # The backend's flows enter the port's merge helper: editing only the helper must re-walk the
    # backend's file too (its walk read the helper), exactly as a fresh walk does.
    path = root / MERGE
    path.write_text(path.read_text() + "\n\ndef _added_by_the_change(x):\n    return x\n")
    again = _follow(root, True)
    assert again == _follow(root, False)
    path = root / FLASHINFER
    text = path.read_text()
    assert "return_lse=True" in text
    path.write_text(text.replace("return_lse=True", "return_lse=False"))
    changed = _follow(root, True)
    assert changed == _follow(root, False)
    assert changed != before


def test_a_served_review_parses_no_module_and_an_edit_reaches_the_scope(tmp_path: Path, audit_cache: Path, monkeypatch) -> None:
    from metax_audit.stages.dataflow import analysis

    root = _port(tmp_path)
    first = _follow(root, True)
    loaded: list[str] = []
    real = analysis.load_module
    monkeypatch.setattr(analysis, "load_module", lambda r, p: loaded.append(p) or real(r, p))
    assert _follow(root, True) == first
    assert loaded == []  # every walk served and every module's search entry kept under its bytes
    # A method added to a class of one file is an implementation every search by that name now finds:
    # the kept entry of that file is read again, and the result equals a fresh walk.
    path = root / MERGE
    path.write_text(path.read_text() + "\n\nclass _Added:\n    def forward(self, x):\n        return x\n")
    again = _follow(root, True)
    assert loaded == [MERGE]
    assert again == _follow(root, False)
