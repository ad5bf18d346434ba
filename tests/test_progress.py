# The terminal's stage line runs no thread of its own, so a review at a terminal forks its pure stages
# onto the other core as a CI run does (core/forked.py forks only where no other thread runs).
from __future__ import annotations

import io
import threading

from rich.console import Console

from metax_audit.cli.progress import RichProgress
from metax_audit.core.forked import Forked


def test_the_stage_line_on_a_terminal_runs_no_thread_and_leaves_forking_on() -> None:
    progress = RichProgress()
    screen = io.StringIO()
    progress._console = Console(file=screen, force_terminal=True, width=80)
    before = threading.active_count()
    progress.stage("trace", "10 backends")
    progress.step("flashinfer")
    assert threading.active_count() == before
    child = Forked(lambda: 6 * 7)
    assert child.started and child.result() == 42
    progress.done()
    assert "trace" in screen.getvalue() and "flashinfer" in screen.getvalue()
