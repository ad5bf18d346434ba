# The rich implementation of the core's Progress protocol; lives beside the CLI so the core
# never imports rich. Quiet when stderr is not a terminal or CI is set.
from __future__ import annotations

import os
import sys

from metax_audit.core.progress import Progress, QuietProgress


class RichProgress:
    def __init__(self) -> None:
        from rich.console import Console
        from rich.status import Status

        self._console = Console(stderr=True)
        self._status: Status | None = None

    def stage(self, name: str, detail: str = "") -> None:
        text = f"[bold]{name}[/bold] {detail}".strip()
        if self._status is None:
            self._status = self._console.status(text)
            self._status.start()
        else:
            self._status.update(text)

    def step(self, detail: str) -> None:
        if self._status is not None:
            self._status.update(detail)

    def done(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None


def make_progress() -> Progress:
    if os.environ.get("CI") or not sys.stderr.isatty():
        return QuietProgress()
    return RichProgress()
