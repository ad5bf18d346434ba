# Per-member reuse inside a changed file: the comparison of one function with its upstream (and base)
# counterpart is kept with what it read of the rest of the port, and served again while that is the same.
"""A member unit is `_compare_function(ctx, qual, upstream fn, port fn)`: the differences of one
function or method. It is a pure function of

- the port function's text (its lines, decorators included) and its name: the unit key;
- the upstream and base files, the counterpart mapping (paths, class renames), the release versions,
  the tool and the config: the key of the file's store (compare/stage.py, compare/per_file.cached_compare);
- what it reads of the rest of the port, each read logged with its answer while the unit is computed:
  the declaration of a changed span (comments and Metax Modification blocks, which can sit outside
  the function), whether the port ever calls the function (every reference in the port package), the
  port's calls of it (a changed signature), the vendor platform's fixed answers and the file's constant
  functions and attributes (each name asked), the names the file defines (each name asked) and the
  comments inside a call.

A kept unit is served when each logged read gives the same answer now. Reads and results name port
lines relative to the function's first line, so a function moved by an edit above it is served with its
lines moved (a unit whose text names a port line - a moved statement - only at the same place)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from metax_audit.core.models import Difference
from metax_audit.stages.compare.consequence import VendorPlatform

Reads = dict[tuple[Any, ...], Any]
UNIT_KEEP = 4  # entries per unit key (HEAD and a staged state alternate in a pre-commit loop)
_MISSING = ("<missing>",)


class Recorder:
    """Where reads go while a unit is computed (nowhere between units). `start` is the unit's first line."""

    def __init__(self) -> None:
        self.reads: Reads | None = None
        self.start = 0

    def note(self, key: tuple[Any, ...], value: Any) -> None:
        if self.reads is not None:
            self.reads.setdefault(key, value)

    def line(self, line: int) -> int:
        return line - self.start


class _LoggedDict(dict[str, Any]):
    """A platform table whose lookups are logged as reads ("platform", table, name)."""

    def __init__(self, table: str, data: dict[str, Any], recorder: Recorder) -> None:
        super().__init__(data)
        self._table = table
        self._recorder = recorder

    def _note(self, name: str) -> None:
        if self._recorder.reads is not None:
            self._recorder.note(("platform", self._table, name), _raw_get(self, name))

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        self._note(name)
        return super().get(name, default)

    def __getitem__(self, name: str) -> Any:
        self._note(name)
        return super().__getitem__(name)

    def __contains__(self, name: object) -> bool:
        self._note(str(name))
        return super().__contains__(name)

    def _whole(self) -> None:
        if self._recorder.reads is not None:
            self._recorder.note(("platform", self._table, "*"), dict(super().items()))

    def __iter__(self) -> Iterator[str]:
        self._whole()
        return super().__iter__()

    def items(self):  # type: ignore[no-untyped-def]
        self._whole()
        return super().items()

    def keys(self):  # type: ignore[no-untyped-def]
        self._whole()
        return super().keys()

    def values(self):  # type: ignore[no-untyped-def]
        self._whole()
        return super().values()

    def __len__(self) -> int:
        self._whole()
        return super().__len__()


def _raw_get(table: dict[str, Any], name: str) -> Any:
    value = dict.get(table, name, _MISSING)
    return dict(value) if isinstance(value, dict) else value


class _LoggedSet(frozenset[str]):
    """The port's KV-cache dtypes (and where they are listed): any use is the read ("platform", "kv")."""

    _recorder: Recorder
    _at: str

    def __new__(cls, values: Iterable[str], at: str, recorder: Recorder) -> _LoggedSet:
        self = super().__new__(cls, values)
        self._recorder, self._at = recorder, at
        return self

    def _note(self) -> None:
        if self._recorder.reads is not None:
            self._recorder.note(("platform", "kv"), (frozenset(frozenset.__iter__(self)), self._at))

    def __contains__(self, value: object) -> bool:
        self._note()
        return super().__contains__(value)

    def __iter__(self) -> Iterator[str]:
        self._note()
        return super().__iter__()

    def __len__(self) -> int:
        self._note()
        return super().__len__()


class _LoggedNames(frozenset[str]):
    """The names the port file defines or imports from its own package: each name asked is a read."""

    _recorder: Recorder

    def __new__(cls, values: Iterable[str], recorder: Recorder) -> _LoggedNames:
        self = super().__new__(cls, values)
        self._recorder = recorder
        return self

    def __contains__(self, value: object) -> bool:
        found = super().__contains__(value)
        self._recorder.note(("port-name", value), found)
        return found

    def __iter__(self) -> Iterator[str]:
        self._recorder.note(("port-names",), frozenset(super().__iter__()))
        return super().__iter__()


def logged_platform(platform: VendorPlatform, recorder: Recorder) -> VendorPlatform:
    """The same answers, each lookup logged into `recorder` while a unit is computed."""
    return VendorPlatform(_LoggedDict("answers", platform.answers, recorder), _LoggedDict("returns", platform.returns, recorder),
                          _LoggedSet(platform.kv_dtypes, platform.kv_dtypes_at, recorder), platform.kv_dtypes_at,
                          _LoggedDict("attrs", platform.attrs, recorder), platform.cls)


def logged_names(names: frozenset[str], recorder: Recorder) -> frozenset[str]:
    return _LoggedNames(names, recorder)


def platform_read(platform: VendorPlatform, key: tuple[Any, ...]) -> Any:
    """The answer of a logged platform read now."""
    if key[1] == "kv":
        return frozenset(frozenset.__iter__(platform.kv_dtypes)), platform.kv_dtypes_at
    table: dict[str, Any] = getattr(platform, key[1])
    return {k: dict(v) if isinstance(v, dict) else v for k, v in dict.items(table)} if key[2] == "*" else _raw_get(table, key[2])


def names_read(names: frozenset[str], key: tuple[Any, ...]) -> Any:
    return frozenset.__contains__(names, key[1]) if key[0] == "port-name" else frozenset(frozenset.__iter__(names))


@dataclass(frozen=True)
class _Entry:
    start: int  # the unit's first line when computed
    reads: Reads  # port lines relative to start
    diffs: tuple[Difference, ...]
    fixed: bool  # a text names a port line (a moved statement): served at the same start only


class MemberUnits:
    """The kept units of one compared file (loaded with its store key) and the ones this review used."""

    def __init__(self, kept: Any, recorder: Recorder) -> None:
        self.kept: dict[str, list[_Entry]] = kept if isinstance(kept, dict) else {}
        self.used: dict[str, list[_Entry]] = {}
        self.recorder = recorder
        self.changed = False
        self.computed = 0  # units computed now
        self.served = 0  # units served from the kept ones

    def unit(self, qual: str, text: str, start: int, compute: Callable[[], Iterable[Difference]],
             read_now: Callable[[tuple[Any, ...]], Any]) -> list[Difference]:
        """The differences of member `qual` (its text from line `start`): a kept entry whose every read
        answers the same now (`read_now(key)`, keys relative to `start`), else computed with its reads logged."""
        ukey = hashlib.blake2b(f"{qual}\0{text}".encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
        entries = self.kept.get(ukey, [])
        rec = self.recorder
        for entry in entries:
            delta = start - entry.start
            if entry.fixed and delta:
                continue
            rec.start = start
            if all(read_now(k) == v for k, v in entry.reads.items()):
                self.used[ukey] = entries
                self.served += 1
                return [replace(d, line=d.line + delta) if delta and d.line else d for d in entry.diffs]
        rec.reads, rec.start = {}, start
        try:
            diffs = list(compute())
            reads = rec.reads
        finally:
            rec.reads = None
        fresh = _Entry(start, reads, tuple(diffs), any(d.kind == "moved" for d in diffs))
        self.used[ukey] = [fresh, *(e for e in entries if e.reads != reads or e.start != start)][:UNIT_KEEP]
        self.changed = True
        self.computed += 1
        return diffs

    def to_keep(self) -> dict[str, list[_Entry]] | None:
        """What to store for the file (this review's units first, then as many older ones), None when
        nothing changed."""
        if not self.changed:
            return None
        out = dict(self.used)
        for ukey, entries in self.kept.items():
            if len(out) >= 2 * len(self.used):
                break
            out.setdefault(ukey, entries)
        return out
