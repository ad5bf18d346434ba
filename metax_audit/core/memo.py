# What a stage may keep between reviews, asked through one object the pipeline hands it (a Memo): the
# stage names what it computes (a kind of entry, a file and its text, the inputs); whether and where it is kept
# is the pipeline's (cache/memo.py keeps it in the result cache; NO_MEMO, for --no-cache, computes everything).
"""The model is mypy's build driver: the checker knows nothing of caching, the driver serves each
module's record from one store. A stage that takes a Memo imports nothing of metax_audit.cache; what
it asks of the memo must be a pure function of what it names (the file's text, the `common` inputs),
since a served value stands for a computed one."""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from metax_audit.core.gitcmd import IndexEntry

T = TypeVar("T")


class Kind(enum.Enum):
    """Every kind of entry the result cache holds; the value is its folder under <cache>/results."""

    REVIEW = "review"  # a whole review of a snapshot (review_cache.py)
    REVIEW_DISCOVERY = "review-discovery"  # the discovery a served review's computed review ended with
    REVISION = "revision"  # a revision's export digest, config and waivers text (incremental.py)
    REACHED = "reached"  # the port files the last trace of a repository reached
    DISCOVERY = "discovery"  # the widened discovery of the last review of a repository
    COMPARE = "compare"  # one file's compare result
    COMPARE_FACTS = "compare-facts"  # what the per-file compare keys read of a port file
    COMPARE_PARTS = "compare-parts"  # member units of a file's comparison (compare/memo.py)
    CHECKS_FILE = "checks-file"  # per-file units of the checks (checks/memo.py)
    BINDING_FILE = "binding-file"  # the same, for the forked binding checks
    UPSTREAM_CALLS = "upstream-calls"  # upstream's call sites of the compared files
    CONTRACTS = "contracts"  # the parsed component contracts
    TRACE_UNIT = "trace-unit"  # one backend's chain or one file's call sites (trace/memo.py)
    DATAFLOW_UNIT = "dataflow-unit"  # one file's dataflow walk (dataflow/memo.py)
    DATAFLOW_SCOPE = "dataflow-scope"  # the dataflow's per-file search entries
    DISCOVER_PARSED = "discover-parsed"  # discover's per-file products (discover/scope.py)
    DISCOVER_IMPORTS = "discover-imports"
    DISCOVER_REGISTRATIONS = "discover-registrations"
    DISCOVER_BINDINGS = "discover-bindings"
    DISCOVER_PRIORITIES = "discover-priorities"
    DISCOVER_SWITCHES = "discover-switches"
    DISCOVER_COMPILED = "discover-compiled"
    INTROSPECT_IMPORTS = "introspect-imports"  # the imports of the files introspection reads
    OP_TABLE_PYTHON = "op-table-python"  # op registrations in Python files
    OP_TABLE_NATIVE = "op-table-native"  # op registrations in C++/CUDA files
    INDEX_MISS = "index-miss"  # the package index's definitive "not there" of a public base, kept a day (stack_pins)


class Products(Protocol):
    """Products of one kind computed from single files, each under the file's path and text."""

    def get(self, path: str, content: str | bytes, compute: Callable[[], T]) -> T:
        """compute(), a product of the file `path` whose text or bytes are `content`."""
        ...

    def save(self) -> None:
        """Keep what this review computed (once, at the end of the stage)."""
        ...


class Units(Protocol):
    """The entries kept under one unit's key, each a value with the state of what it read then."""

    def find(self, root: str, state: Callable[[str, str], Any]) -> tuple[list[Any], tuple[Any] | None]:
        """The entries, and (as a 1-tuple) the value of the first whose every read `(kind, name)` has the
        same `state(kind, name)` now, moved to the snapshot `root`; None when none holds."""
        ...

    def keep(self, root: str, reads: dict[tuple[str, str], Any], value: Any, entries: list[Any]) -> None:
        """Keep `value` with the state of its reads, ahead of a few of the other `entries`."""
        ...


class Memo(Protocol):
    """What a stage asks of the review's cache."""

    @property
    def enabled(self) -> bool:
        """Whether anything is kept (False: --no-cache)."""
        ...

    def products(self, kind: Kind, *common: Any) -> Products:
        """Per-file products of `kind`, each a function of its file's text and of `common`."""
        ...

    def load(self, kind: Kind, *parts: Any) -> Any | None:
        """The value kept for the inputs `parts`, or None (the caller checks its shape)."""
        ...

    def store(self, kind: Kind, value: Any, *parts: Any) -> None:
        """Keep `value`, a function of the inputs `parts`."""
        ...

    def digest(self, *parts: Any) -> str:
        """One part standing for many inputs (digested once, so that many keys naming them stay small)."""
        ...

    def units(self, kind: Kind, *parts: Any) -> Units | None:
        """The kept entries of the unit named by `parts`; None when nothing is kept (compute it)."""
        ...


class HeldTree(Protocol):
    """A kept snapshot brought up to date and locked for one review; release() unlocks it."""

    root: Path
    count: int  # its files
    digest: str  # the tree digest of root (as resultcache.tree_digest computes it)

    def release(self) -> None: ...


class KeptTrees(Protocol):
    """Snapshots kept between reviews (cache/kept_snapshot.py): the snapshot stage asks for the tree of
    the selected files, up to date; None means export afresh (not a plain tree, or another review holds it)."""

    def hold_worktree(self, top: Path, selected: list[str]) -> HeldTree | None: ...

    def hold_index(self, top: Path, gitdir: Path, entries: list[IndexEntry], selected: list[IndexEntry],
                   ) -> HeldTree | None: ...


class _Computed:
    def get(self, path: str, content: str | bytes, compute: Callable[[], T]) -> T:
        return compute()

    def save(self) -> None:
        return None


class _NoMemo:
    """Keeps nothing: every product is computed (--no-cache, and a stage called on its own)."""

    enabled = False

    def products(self, kind: Kind, *common: Any) -> Products:
        return _Computed()

    def load(self, kind: Kind, *parts: Any) -> Any | None:
        return None

    def store(self, kind: Kind, value: Any, *parts: Any) -> None:
        return None

    def digest(self, *parts: Any) -> str:
        return ""

    def units(self, kind: Kind, *parts: Any) -> Units | None:
        return None


NO_MEMO: Memo = _NoMemo()


def file_digest(path: Path | None) -> str:
    """sha256 of a file's bytes ("none", "unreadable"): how a unit names a file it depends on."""
    if path is None:
        return "none"
    try:
        from metax_audit.core import inputs

        return hashlib.sha256(inputs.read_bytes(path)).hexdigest()  # a FIFO is refused, never waited on
    except OSError:
        return "unreadable"


def content_state(path: Path) -> str | None:
    """A file's bytes as a digest, None when there is no such file (a state a stored unit compares)."""
    try:
        return hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except OSError as exc:
        return f"unreadable: {exc.errno}"


def read_kept_file(path: Path) -> bytes | None:
    """The bytes of a file a stage kept on disk itself (the stack facts, upstream's op index), or None when it
    is not a regular file the input reader takes: a link is not followed and a FIFO never blocks
    (core.inputs), so a planted entry costs a recomputation, never a hang."""
    from metax_audit.core.inputs import read_bytes

    try:
        return read_bytes(path, follow_symlinks=False)
    except OSError:  # InputFileError included: a link, FIFO, directory or an oversized file is a miss
        return None
