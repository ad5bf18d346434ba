"""The collector is paused while a review runs (pysource.paused_gc); cycles are still bounded by
collect_if_grown at each stage's end."""

from __future__ import annotations

import gc
import weakref

from metax_audit.core import pysource


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


def _cycle() -> weakref.ref[_Node]:
    return weakref.ref(_Node())


def test_paused_inside_and_restored_after() -> None:
    assert gc.isenabled()
    with pysource.paused_gc():
        assert not gc.isenabled()
        with pysource.paused_gc():  # a baseline review inside a review
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause holds
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled() -> None:
    gc.disable()
    try:
        with pysource.paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_cycles_wait_for_growth_then_are_collected() -> None:
    with pysource.paused_gc():
        ref = _cycle()
        assert not pysource.collect_if_grown(growth_mb=1 << 20)  # far below the growth: no collection
        assert ref() is not None
        assert pysource.collect_if_grown(growth_mb=-1)  # "grown" past the bound: one full collection
        assert ref() is None


def test_outside_a_pause_nothing_is_collected() -> None:
    assert not pysource.collect_if_grown(growth_mb=-1)


def test_a_stage_end_collects_once_grown(monkeypatch) -> None:
    from metax_audit.core.progress import QuietProgress
    from metax_audit.pipeline.review import _Run

    monkeypatch.setattr(pysource, "GC_GROWTH_MB", -1)
    run = _Run()
    with pysource.paused_gc():
        ref = _cycle()
        with run.stage("trace", QuietProgress()):
            pass
        assert ref() is None
    assert [s.name for s in run.stages] == ["trace"]


def test_survivors_leave_the_young_generation() -> None:
    frozen = gc.get_freeze_count()
    with pysource.paused_gc():
        kept = [[i] for i in range(5000)]
    assert gc.get_count()[0] < 5000  # the lists are no longer young: a young collection will not scan them
    assert gc.get_freeze_count() == frozen  # nothing frozen where nothing was (tests: still collectable)
    assert kept
