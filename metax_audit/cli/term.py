# Terminal mechanics beside the CLI: which console (colour: --color, NO_COLOR, FORCE_COLOR), how wide
# (the terminal's width or COLUMNS; a pipe is not wrapped), and lines wrapped or cut at whole words only.
from __future__ import annotations

import os
import textwrap
from typing import TYPE_CHECKING, Literal

from metax_audit.report.text import ELLIPSIS

if TYPE_CHECKING:
    from rich.console import Console

ColorMode = Literal["auto", "always", "never"]
COLOR_MODES: tuple[ColorMode, ...] = ("auto", "always", "never")


def color_mode(asked: str) -> ColorMode:
    """--color as given, with `auto` settled by the environment: NO_COLOR (non-empty) means never,
    FORCE_COLOR (non-empty) always (https://no-color.org, https://force-color.org); NO_COLOR wins."""
    if asked not in COLOR_MODES:
        raise ValueError(f"--color must be auto, always or never (got {asked!r})")
    if asked != "auto":
        return asked  # type: ignore[return-value]
    if os.environ.get("NO_COLOR"):
        return "never"
    if os.environ.get("FORCE_COLOR"):
        return "always"
    return "auto"


def make_console(asked: str = "auto", *, stderr: bool = False) -> Console:
    """A rich console for --color: `never` writes no escape sequence at all (not even bold), `always`
    styles a pipe too; `auto` styles a terminal only."""
    from rich.console import Console

    mode = color_mode(asked)
    if mode == "never":
        return Console(stderr=stderr, color_system=None, highlight=False)
    if mode == "always":
        return Console(stderr=stderr, force_terminal=True, highlight=False)
    return Console(stderr=stderr, highlight=False)


def wrap_width(console: Console) -> int | None:
    """The width lines are wrapped to: COLUMNS when set, else the terminal's own; None for a pipe or a
    file with no COLUMNS (one line per item, whole, for grep and logs)."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    isatty = getattr(console.file, "isatty", None)
    if isatty is not None and isatty():
        return console.size.width
    return None


def wrap_words(text: str, width: int | None, *, first: str = "", indent: int = 4, max_lines: int | None = None) -> list[str]:
    """`first` + `text` as lines of at most `width` columns, broken between words only (a path
    longer than the width stands alone on its line, whole: the terminal folds it, and copying it
    gives it back in one piece); continuation lines indented by `indent`. With `max_lines`, what
    would take more lines is cut after a whole word and marked ' ...'. Width None: one line."""
    if width is None:
        return [first + text]
    width = max(width, 20)
    lead, words = [], text.split()
    if first.strip() and words and len(first) + len(words[0]) > width >= indent + len(words[0]):
        lead, first = [first.rstrip()], " " * indent  # a path that fits on a line of its own goes there whole
    lines = lead + (textwrap.wrap(text, width=width, initial_indent=first, subsequent_indent=" " * indent,
                                  break_long_words=False, break_on_hyphens=False) or [first])
    if max_lines is not None and len(lines) > max_lines:
        lines = lines[:max_lines]
        last = lines[-1]
        while len(last) + len(ELLIPSIS) > width and " " in last.strip():
            last = last.rstrip().rsplit(" ", 1)[0]
        lines[-1] = last + ELLIPSIS
    return lines
