# Where metax-audit keeps what it computes or downloads once and reuses (upstream sources, stack
# facts, the result cache): one root for every stage and the cache layer, so no stage imports the cache to find it.
from __future__ import annotations

import os
from pathlib import Path


def cache_root(cache_dir: Path | None = None) -> Path:
    """The metax-audit cache: explicit argument, then $METAX_AUDIT_CACHE, then ~/.cache."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("METAX_AUDIT_CACHE")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "metax-audit"
