# Progress as a small state object the core calls; the rich implementation lives beside the
# CLI (cli_progress.py) so the core never imports rich and stays quiet in CI.
from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def stage(self, name: str, detail: str = "") -> None: ...

    def step(self, detail: str) -> None: ...

    def done(self) -> None: ...


class QuietProgress:
    def stage(self, name: str, detail: str = "") -> None:
        pass

    def step(self, detail: str) -> None:
        pass

    def done(self) -> None:
        pass
