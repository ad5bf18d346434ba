# Per-file memo of the checks' work that is a function of one port file's bytes (plus what each unit
# names in its own key): a one-file change recomputes that file's part, the rest is read back.
"""One record per port file, asked of the review's Memo (core/memo.py; kind checks-file, inputs: the file's
repo-relative path and the sha256 of its bytes; the result cache adds the tool's identity). The record is
a dict unit -> value; a unit is a tuple naming the computation and every other input it reads (the
packages asked for, the upstream counterpart's path and digest...). Only computations whose whole
input is that file and the unit's own key are kept here: checks that read the trace, the installed
stack or other port files through the symbol table are not (see each caller).

A review loads each file's record at most once (on first use) and writes back, once, the records
that gained a unit (save()). With NO_MEMO (`--no-cache`) every unit is computed."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, TypeVar

from metax_audit.core.memo import NO_MEMO, Kind, Memo, file_digest

T = TypeVar("T")


class FileMemo:
    def __init__(self, root: Path, *, memo: Memo = NO_MEMO, kind: Kind = Kind.CHECKS_FILE) -> None:
        self.root = root  # the snapshot; a unit may also be about a file of another tree (upstream's)
        self.memo = memo
        self.enabled = memo.enabled
        # A process of its own (the forked binding checks) keeps its records under another kind: two
        # writers of one record would each drop the other's units.
        self.kind = kind
        self._records: dict[Path, dict[Hashable, Any]] = {}
        self._entries: dict[Path, tuple[str, str]] = {}
        self._digests: dict[Path, str] = {}
        self._dirty: set[Path] = set()
        self._fresh: set[tuple[Path, tuple[Hashable, ...]]] = set()
        self.hits = 0  # units read back from the cache
        self.misses = 0  # units computed in this review

    def get(self, path: str, unit: tuple[Hashable, ...], compute: Callable[[], T], *, root: Path | None = None) -> T:
        """compute(), or what it returned for the bytes of `path` (under `root`, default the snapshot)
        and this unit before."""
        if not self.enabled:
            return compute()
        full = (root or self.root) / path
        record = self._records.get(full)
        if record is None:
            entry = self._entries[full] = (path, self.digest(full))
            loaded = self.memo.load(self.kind, *entry)
            record = self._records[full] = loaded if isinstance(loaded, dict) else {}
        if unit in record:
            if (full, unit) not in self._fresh:  # asked again in this review is not "reused"
                self.hits += 1
            return record[unit]  # type: ignore[no-any-return]
        self.misses += 1
        value = record[unit] = compute()
        self._fresh.add((full, unit))
        self._dirty.add(full)
        return value

    def digest(self, full: Path) -> str:
        """sha256 of the file's bytes, read once per review (a unit names another file's this way)."""
        found = self._digests.get(full)
        if found is None:
            found = self._digests[full] = file_digest(full)
        return found

    def save(self) -> None:
        """Write the records that gained a unit in this review (each once)."""
        for full in sorted(self._dirty):
            self.memo.store(self.kind, self._records[full], *self._entries[full])
        self._dirty.clear()

    def describe(self) -> str:
        """For the stage note, when something was read back ("" otherwise: a fresh review says nothing)."""
        return f"per-file memo: {self.hits} reused, {self.misses} computed" if self.hits else ""
