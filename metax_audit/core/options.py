# The options of one review, as the CLI (or a test) states them: a record every stage that needs an
# option reads (upstream, baseline, the review cache), so none of them imports the pipeline for it.
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path

from metax_audit.core.config import AuditConfig
from metax_audit.core.models import SnapshotMode


@dataclass(frozen=True)
class ReviewOptions:
    mode: SnapshotMode | None = None  # None: staged when something is staged, else HEAD
    repo: Path | None = None
    rev: str | None = None
    paths: tuple[str, ...] = ()
    upstream: str | None = None
    base: str | None = None
    stack: Path | None = None  # a captured stack manifest instead of importing kernels
    python: str | None = None  # target interpreter for introspection and probes
    extra_path: tuple[Path, ...] = ()  # prepended to the target's sys.path (e.g. the demo's stub stack)
    static_roots: tuple[Path, ...] = ()  # source trees to read signatures from when import fails
    config_file: Path | None = None
    waivers: Path | None = None
    test_command: str | None = None
    run_probes: bool = False
    introspect_timeout: float = 120.0
    cache_dir: Path | None = None
    today: _dt.date = field(default_factory=_dt.date.today)
    baseline: str | None = None  # compare with this revision (staged/worktree default: HEAD)
    merge_base: str | None = None  # compare with the merge base of the reviewed commit and this branch
    no_baseline: bool = False
    no_cache: bool = False  # recompute everything (the result cache is neither read nor written)
    # Pinned kernel packages accepted unbound (their calls unchecked); None: the config's allow-unbound.
    allow_unbound: tuple[str, ...] | None = None
    index_url: str | None = None  # the package index for public bases (default: pip's configured one)
    config: AuditConfig | None = None  # the reviewed subject's config, for its baseline (baseline_options)
