# The result cache as a stage sees it (core/memo.py's Memo): per-file products and whole values kept
# under typed keys in the one store (cache/resultcache.py, cache/store.py). The pipeline makes one per review.
from __future__ import annotations

from typing import Any

from metax_audit.cache import resultcache
from metax_audit.core.memo import NO_MEMO, Kind, Memo, Products
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

    @staticmethod
    def _key(kind: Kind, parts: tuple[Any, ...]) -> resultcache.Key:
        """An upstream release stands in a key by its identity (its source, version and files' stat), which
        the cache decides; every other part by its JSON."""
        return resultcache.key(kind, *(resultcache.upstream_identity(p) if isinstance(p, UpstreamInfo) else p
                                       for p in parts))


def review_memo(enabled: bool) -> Memo:
    """The memo a review hands its stages: the result cache, or NO_MEMO for --no-cache."""
    return ResultMemo() if enabled else NO_MEMO
