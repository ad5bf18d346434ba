# The trace memo: each unit of the trace (one backend's chain, one in-scope file's context-free
# call sites) is kept with the state of the port files and folders it read, and served again while
# that state holds. A one-file change re-traces the backends and files that read that file only.
"""Why this is exact: every unit is traced with a resolver of its own (trace/chain.py), so its result
is a function of its own inputs only: the unit's key (tool, upstream release, config, the
registration or the file and the functions the chains walked in it) and what it read through the
module index. The index logs every port name it was asked for (a lookup that found nothing too: a
file added there later changes the answer) and every port folder it listed; upstream reads are
covered by the upstream identity in the key. A stored entry is used only when each of those names
and folders looks now as it did then: the bytes of `name.py` and `name/__init__.py` and whether
`name/` is a folder; a listed folder's entries. The units are asked of the review's Memo (core/memo.py);
a cache that cannot be read or written only costs time."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from metax_audit.core.memo import NO_MEMO, Kind, Memo, content_state
from metax_audit.stages.trace.modules import ModuleIndex, ReadLog, Skip

T = TypeVar("T")


@dataclass(frozen=True)
class UnitResult:
    """What a unit gives the whole trace besides its own value."""

    files: frozenset[str]  # port files whose functions it walked (reached files)
    walked: frozenset[str]  # qualnames of the functions it walked
    skips: tuple[Skip, ...]  # files it met that have no tree


@dataclass
class MemoCount:
    """How many units of each kind ("backend", "scope") the memo served and how many were traced now."""

    served: dict[str, int] = field(default_factory=dict)
    computed: dict[str, int] = field(default_factory=dict)

    def note(self) -> str:
        parts = [f"{self.served.get(k, 0)} of {self.served.get(k, 0) + self.computed.get(k, 0)} {label} from the trace memo"
                 for k, label in (("backend", "backends"), ("scope", "files' own call sites"))
                 if self.served.get(k, 0)]
        return "; ".join(parts)


class TraceMemo:
    """Reads and writes units through the review's memo (NO_MEMO: every unit is traced); `common` names
    what every unit depends on."""

    def __init__(self, index: ModuleIndex, common: list[str], *, memo: Memo = NO_MEMO) -> None:
        self.index = index
        self.common = common
        self.memo = memo
        self._states: dict[tuple[str, str], Any] = {}
        self.count = MemoCount()

    def unit(self, parts: list[Any], compute: Callable[[], tuple[T, UnitResult]]) -> tuple[T, UnitResult]:
        """The unit's value: stored when every port name and folder it read is unchanged, else computed
        (with the index's read log on) and stored with the state of what it read."""
        units = self.memo.units(Kind.TRACE_UNIT, *self.common, *parts)
        root = str(self.index.port_root)
        entries, hit = units.find(root, self._state) if units is not None else ([], None)
        if hit is not None:
            self.count.served[parts[0]] = self.count.served.get(parts[0], 0) + 1
            served: tuple[T, UnitResult] = hit[0]
            return served
        outer = self.index.log
        log = self.index.log = ReadLog()
        try:
            value, result = compute()
        finally:
            self.index.log = outer
        if outer is not None:  # a unit inside a unit: the outer one read this too
            outer.names |= log.names
            outer.folders |= log.folders
            outer.skips.update(log.skips)
        # the skipped files a unit met are what the index logged (a unit computes its files and walk only)
        result = UnitResult(result.files, result.walked, tuple(sorted(log.skips.values(), key=lambda s: s.path)))
        self.count.computed[parts[0]] = self.count.computed.get(parts[0], 0) + 1
        if units is not None:
            reads = {**{("name", n): self._state("name", n) for n in sorted(log.names)},
                     **{("folder", n): self._state("folder", n) for n in sorted(log.folders)}}
            units.keep(root, reads, (value, result), entries)
        return value, result

    def _state(self, kind: str, name: str) -> Any:
        """How a port name (or folder) looks in this snapshot, compared by value with a stored entry."""
        got = self._states.get((kind, name))
        if got is None:
            base = self.index.port_root / Path(*name.split(".")) if name else self.index.port_root
            got = _folder_state(base) if kind == "folder" else (content_state(base.with_suffix(".py")) if name else None,
                                                               content_state(base / "__init__.py"), base.is_dir())
            self._states[(kind, name)] = got
        return got


def _folder_state(folder: Path) -> tuple | None:
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return None
    return tuple((e.name, e.is_file(), e.is_dir() and os.path.isfile(os.path.join(e.path, "__init__.py"))) for e in entries)
