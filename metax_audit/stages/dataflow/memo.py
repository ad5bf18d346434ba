# The dataflow memo: each in-scope file's walk (what it records: flows, unpackings, scale calls,
# what it could not follow) is kept with what it read, and served again while that holds. A
# one-file change walks that file and the files whose walks entered it or searched what it defines.
"""Why this is exact: a file's walk writes only its own recorder (merged in file order, first visit
wins, as one shared recorder did) and reads (1) module files, its own and those of the helpers it
enters or looks for, logged by Analysis.module/has_file and compared by their bytes; (2) searches by
name over the modules in scope (Analysis.implementations, Analysis.global_ctor), logged by name and
compared by their answer in this snapshot; (3) the contracts and the port package, in the key with
the tool's identity (the review's Memo: core/memo.py). A cache that cannot be read or written only costs time."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from metax_audit.core.memo import NO_MEMO, Kind, Memo, content_state

T = TypeVar("T")


@dataclass
class UnitReads:
    """What one file's walk read besides its own file: module files (entered or looked for) and the
    searches by name over the scope (dynamic dispatch by method name, wrapper constructors by name)."""

    files: set[str] = field(default_factory=set)
    methods: set[str] = field(default_factory=set)
    ctor_names: set[str] = field(default_factory=set)


class Searches(Protocol):
    """What the memo asks of the analysis (dataflow/analysis.py's Analysis)."""

    root: Path
    port: str
    contracts: Any
    log: UnitReads | None

    def implementations(self, method: str) -> Sequence[Any]: ...

    def global_ctor(self, name: str) -> str | None: ...


class DataflowMemo:
    def __init__(self, an: Searches, common: list[str] | None, memo: Memo = NO_MEMO) -> None:
        self.an = an
        self.memo = memo if common is not None else NO_MEMO
        self.common = [*(common or []), an.port, an.contracts]  # the contracts: the memo digests the record
        self._digests: dict[str, str | None] = {}
        self.served = 0

    def unit(self, path: str, compute: Callable[[], T]) -> T:
        units = self.memo.units(Kind.DATAFLOW_UNIT, *self.common, path)
        if units is None:
            return compute()
        root = str(self.an.root)
        entries, hit = units.find(root, self._state)
        if hit is not None:
            self.served += 1
            served: T = hit[0]
            return served
        outer, self.an.log = self.an.log, UnitReads()
        try:
            value = compute()
            log = self.an.log
        finally:
            self.an.log = outer
        reads = {**{("file", p): self._state("file", p) for p in sorted(log.files | {path})},
                 **{("method", m): self._state("method", m) for m in sorted(log.methods)},
                 **{("ctor", n): self._state("ctor", n) for n in sorted(log.ctor_names)}}
        units.keep(root, reads, value, entries)
        return value

    def _state(self, kind: str, name: str) -> Any:
        if kind == "file":
            if name not in self._digests:
                self._digests[name] = content_state(self.an.root / name)
            return self._digests[name]
        if kind == "method":
            return [f.dotted for f in self.an.implementations(name)]
        return self.an.global_ctor(name)

