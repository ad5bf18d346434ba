# The result cache stays under its limit: the least recently used entries (written or read last
# longest ago) go first, at most once per interval.
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from metax_audit.cache import resultcache
from metax_audit.cache.store import Key, Kind


def _entry(kind: str, name: str, size: int, age_s: float) -> Path:
    resultcache.store(Key(Kind(kind), name), ["x" * size] if kind == "trace-unit" else ("x" * size,))  # each kind's shape
    path = resultcache.results_dir() / kind / f"{name}.entry"
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_the_least_recently_used_entries_go_first(audit_cache: Path) -> None:
    old = _entry("compare", "old", 4000, 3000)
    read = _entry("trace-unit", "read", 4000, 2000)
    new = _entry("review", "new", 4000, 10)
    assert resultcache.load(Key(Kind.TRACE_UNIT, "read")) == ["x" * 4000]  # reading it makes it recent
    freed = resultcache.trim(limit_bytes=11_000, every_s=0)  # 3 x ~4 kB: over; 80% of it keeps two
    assert not old.exists() and read.exists() and new.exists()
    assert freed >= 4000


def test_under_the_limit_nothing_goes_and_the_scan_waits_for_its_interval(audit_cache: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    kept = _entry("compare", "kept", 1000, 5000)
    assert resultcache.trim(limit_bytes=10_000, every_s=0) == 0 and kept.exists()
    # Within the interval nothing is scanned, even over the limit; the limit comes from the environment.
    monkeypatch.setenv("METAX_AUDIT_CACHE_MAX_MB", "0.0001")
    assert resultcache.trim() == 0 and kept.exists()
    assert resultcache.trim(every_s=0) > 0 and not kept.exists()
