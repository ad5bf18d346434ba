# The introspection worker started ahead of its targets (introspect.prestart): same facts as a
# fresh worker, a hang or crash while preloading still becomes a fact, a cache hit stops it.
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from conftest import write_tree

from metax_audit.core import subproc
from metax_audit.stages import introspect as introspect_mod
from metax_audit.stages.introspect import introspect, prestart


@pytest.fixture
def site(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "site", {
        "mxp_good/__init__.py": "LOADED = []\ndef kernel(q, k, *, scale=1.0):\n    return q\n",
        "mxp_good/late.py": "import mxp_good\nmxp_good.LOADED.append(1)\ndef f(x):\n    return x\n",
        "mxp_boom/__init__.py": "raise RuntimeError('no MACA runtime found')\n",
        "mxp_hang/__init__.py": "import time\ntime.sleep(60)\n",
        "mxp_crash/__init__.py": "import os\nos._exit(3)\n",
    })


def _started(preload: list[str], site: Path) -> introspect_mod.Prestarted:
    worker = prestart(preload, python=sys.executable, extra_path=[site])
    assert worker is not None
    return worker


def test_prestarted_worker_gives_the_facts_of_a_fresh_one(site: Path) -> None:
    targets = ["mxp_good.kernel", "mxp_good.missing", "mxp_boom.f", "mxp_good.late.f", "nosuchpkg.g"]
    fresh = introspect(targets, extra_path=[site], timeout=30).facts
    early = introspect(targets, extra_path=[site], timeout=30,
                       prestarted=_started(["mxp_good", "mxp_boom", "nosuchpkg"], site)).facts
    assert early == fresh
    assert early["mxp_good.kernel"].status == "ok"
    assert early["mxp_boom.f"].status != "ok" and "no MACA runtime" in (early["mxp_boom.f"].error or "")


def test_a_hang_while_preloading_is_the_timeout_of_that_package(site: Path) -> None:
    worker = _started(["mxp_good", "mxp_hang"], site)
    began = time.perf_counter()
    facts = introspect(["mxp_good.kernel", "mxp_hang.f", "mxp_hang.g"], extra_path=[site], timeout=3,
                       prestarted=worker).facts
    assert time.perf_counter() - began < 5.5  # waited out once, not once more in a fresh worker
    assert facts["mxp_hang.f"].status == "timeout"
    assert "did not finish within 3 s" in (facts["mxp_hang.f"].error or "")
    assert facts["mxp_hang.g"].status in {"timeout", "not-found", "import-error"}  # read statically after
    assert facts["mxp_good.kernel"].status == "ok"
    assert facts == introspect(["mxp_good.kernel", "mxp_hang.f", "mxp_hang.g"], extra_path=[site], timeout=3).facts


def test_a_crash_while_preloading_is_attributed_as_a_fresh_run_would(site: Path) -> None:
    targets = ["mxp_good.kernel", "mxp_crash.g", "mxp_good.late.f"]
    facts = introspect(targets, extra_path=[site], timeout=30, prestarted=_started(["mxp_crash"], site)).facts
    assert facts["mxp_crash.g"].status == "crash" and "exit 3" in (facts["mxp_crash.g"].error or "")
    assert facts["mxp_good.kernel"].status == "ok" and facts["mxp_good.late.f"].status == "ok"
    assert facts == introspect(targets, extra_path=[site], timeout=30).facts


def test_a_cache_hit_stops_the_prestarted_worker(tmp_path: Path, audit_cache: Path, site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not introspect_mod.stack_seen(python=sys.executable, extra_path=[site])
    cold = introspect(["mxp_good.kernel"], python=sys.executable, extra_path=[site], cache=True, timeout=30,
                      prestarted=_started(["mxp_good"], site))
    assert cold.cache_entry is None and cold.facts["mxp_good.kernel"].status == "ok"
    assert introspect_mod.stack_seen(python=sys.executable, extra_path=[site])

    worker = _started(["mxp_hang"], site)  # would hang if it were asked anything
    began = time.perf_counter()
    warm = introspect(["mxp_good.kernel"], python=sys.executable, extra_path=[site], cache=True, timeout=30,
                      prestarted=worker)
    assert time.perf_counter() - began < 10
    assert warm.cache_entry is not None and warm.facts == cold.facts
    assert worker._started is None  # killed, its sandbox removed
    worker.discard()  # and discarding again is harmless


def test_a_worker_started_for_another_path_is_not_used(tmp_path: Path, site: Path) -> None:
    other = write_tree(tmp_path / "other", {"mxp_good/__init__.py": "def kernel(a):\n    return a\n"})
    facts = introspect(["mxp_good.kernel"], extra_path=[other], timeout=30, prestarted=_started(["mxp_good"], site)).facts
    assert [p.name for p in facts["mxp_good.kernel"].params or ()] == ["a"]


def test_started_process_does_not_block_on_unread_stderr(tmp_path: Path) -> None:
    code = "import sys\nsys.stderr.write('x' * 500_000)\nsys.stderr.flush()\nprint(sys.stdin.readline().strip() + sys.stdin.read())"
    started = subproc.start([sys.executable, "-c", code], cwd=tmp_path, first_input="a\n")
    done = started.finish("b", timeout=20)
    assert not done.timed_out and done.returncode == 0
    assert done.stdout.strip() == "ab" and len(done.stderr) == 500_000


def test_review_prestarts_only_for_a_real_stack_not_yet_seen(tmp_path: Path, audit_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from metax_audit.core.config import AuditConfig
    from metax_audit.pipeline.review import ReviewOptions, _prestart_introspection

    config = AuditConfig()
    assert _prestart_introspection(config, ReviewOptions(extra_path=(tmp_path,))) is None  # a stub stack
    assert _prestart_introspection(config, ReviewOptions(stack=tmp_path / "m.json")) is None  # a manifest
    worker = _prestart_introspection(config, ReviewOptions(python=sys.executable))
    assert worker is not None
    worker.discard()
    key = introspect_mod.stack_identity(sys.executable, ())
    assert key is not None
    marker = introspect_mod.stack_cache_dir() / f"{key}.seen"
    marker.parent.mkdir(parents=True)
    marker.write_text("", encoding="utf-8")
    assert _prestart_introspection(config, ReviewOptions(python=sys.executable)) is None  # facts likely cached
