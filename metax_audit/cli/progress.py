# The rich implementation of the core's Progress protocol; lives beside the CLI so the core
# never imports rich. Quiet when stderr is not a terminal or CI is set.
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from metax_audit.core.progress import Progress, QuietProgress

if TYPE_CHECKING:
    from rich.live import Live


class RichProgress:
    """The stage line on the terminal, redrawn on each update and never by a thread of its own: the
    review forks its pure stages onto the other core only where no other thread runs (core/forked.py),
    and rich's spinner refreshes from a thread, which sent a terminal's review down the serial path."""

    def __init__(self) -> None:
        from rich.console import Console

        self._console = Console(stderr=True)
        self._live: Live | None = None

    def _show(self, text: str) -> None:
        from rich.live import Live
        from rich.spinner import Spinner

        shown = Spinner("dots", text)
        if self._live is None:
            self._live = Live(shown, console=self._console, auto_refresh=False, transient=True,
                              redirect_stdout=False, redirect_stderr=False)
            self._live.start(refresh=True)
        else:
            self._live.update(shown, refresh=True)

    def stage(self, name: str, detail: str = "") -> None:
        self._show(f"[bold]{name}[/bold] {detail}".strip())

    def step(self, detail: str) -> None:
        if self._live is not None:
            self._show(detail)

    def done(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


def make_progress() -> Progress:
    if os.environ.get("CI") or not sys.stderr.isatty():
        return QuietProgress()
    return RichProgress()
