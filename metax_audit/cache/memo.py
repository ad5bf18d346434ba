# The result cache as a stage sees it (core/memo.py's Memo): per-file products and whole values kept
# under typed keys in the one store (cache/resultcache.py, cache/store.py). The pipeline makes one per review.
from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from typing import Any

from metax_audit.cache import resultcache
from metax_audit.core.memo import NO_MEMO, Kind, Memo, Products, Units
from metax_audit.core.models import UpstreamInfo


class ResultMemo:
    """A Memo over the result cache (keys: the kind, the inputs and the tool's identity)."""

    enabled = True

    def products(self, kind: Kind, *common: Any) -> Products:
        return resultcache.FileProducts(kind, *common)

    def load(self, kind: Kind, *parts: Any) -> Any | None:
        return resultcache.load(self._key(kind, parts))

    def store(self, kind: Kind, value: Any, *parts: Any) -> None:
        resultcache.store(self._key(kind, parts), value)

    def digest(self, *parts: Any) -> str:
        return resultcache.digest(*(_part(p) for p in parts))

    def units(self, kind: Kind, *parts: Any) -> Units | None:
        return _Units(self._key(kind, parts))

    @staticmethod
    def _key(kind: Kind, parts: tuple[Any, ...]) -> resultcache.Key:
        """An upstream release stands in a key by its identity (its source, version and files' stat), which
        the cache decides; every other part by its JSON."""
        return resultcache.key(kind, *(_part(p) for p in parts))


def _part(p: Any) -> Any:
    """A key part as the cache digests it: an upstream release by its identity, a record (the contracts) by
    the sha256 of its encoding, anything else by its JSON."""
    if isinstance(p, UpstreamInfo):
        return resultcache.upstream_identity(p)
    if dataclasses.is_dataclass(p) and not isinstance(p, type):
        from metax_audit.cache.records import registry

        return hashlib.sha256(registry().dumps(p)).hexdigest()
    return p


class _Units:
    def __init__(self, key: resultcache.Key) -> None:
        self._key = key

    def find(self, root: str, state: Callable[[str, str], Any]) -> tuple[list[Any], tuple[Any] | None]:
        return resultcache.find_unit(self._key, root, state)

    def keep(self, root: str, reads: dict[tuple[str, str], Any], value: Any, entries: list[Any]) -> None:
        resultcache.keep_unit(self._key, root, reads, value, entries)


def review_memo(enabled: bool) -> Memo:
    """The memo a review hands its stages: the result cache, or NO_MEMO for --no-cache."""
    return ResultMemo() if enabled else NO_MEMO
