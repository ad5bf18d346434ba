# The dataflow memo: each in-scope file's walk (what it records: flows, unpackings, scale calls,
# what it could not follow) is kept with what it read, and served again while that holds. A
# one-file change walks that file and the files whose walks entered it or searched what it defines.
"""Why this is exact: a file's walk writes only its own recorder (merged in file order, first visit
wins, as one shared recorder did) and reads (1) module files, its own and those of the helpers it
enters or looks for, logged by Analysis.module/has_file and compared by their bytes; (2) searches by
name over the modules in scope (Analysis.implementations, Analysis.global_ctor), logged by name and
compared by their answer in this snapshot; (3) the contracts and the port package, in the key with
the tool's identity (resultcache.key). A cache that cannot be read or written only costs time."""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

KIND = "dataflow-unit"
KEEP = 4  # entries per file: HEAD and the staged state alternate in a pre-commit loop
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
    def __init__(self, an: Searches, common: list[str] | None) -> None:
        self.an = an
        self.use_cache = common is not None
        self.common = [*(common or []), an.port, hashlib.sha256(pickle.dumps(an.contracts)).hexdigest()] \
            if self.use_cache else []
        self._digests: dict[str, str | None] = {}
        self.served = 0

    def unit(self, path: str, compute: Callable[[], T]) -> T:
        from metax_audit import resultcache

        if not self.use_cache:
            return compute()
        entry = resultcache.key(KIND, *self.common, path)
        stored = resultcache.load(KIND, entry)
        root = str(self.an.root)
        if isinstance(stored, list):
            for old_root, reads, value in stored:
                if all(self._state(kind, name) == state for (kind, name), state in reads.items()):
                    self.served += 1
                    served: T = resultcache.rebase(value, old_root, root) if old_root not in (None, root) else value
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
        kept = [e for e in (stored if isinstance(stored, list) else []) if e[1] != reads][: KEEP - 1]
        names_root = root.encode() in pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        resultcache.store(KIND, entry, [(root if names_root else None, reads, value), *kept])
        return value

    def _state(self, kind: str, name: str) -> Any:
        if kind == "file":
            if name not in self._digests:
                try:
                    self._digests[name] = hashlib.blake2b((self.an.root / name).read_bytes(), digest_size=16).hexdigest()
                except OSError:
                    self._digests[name] = None
            return self._digests[name]
        if kind == "method":
            return [f.dotted for f in self.an.implementations(name)]
        return self.an.global_ctor(name)
