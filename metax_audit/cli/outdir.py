# Where a review's reports go by default: a per-repository directory under the user's cache,
# never inside the audited checkout; and the check that a directory is writable, done up front.
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from metax_audit.core.errors import ConfigError


def default_output_dir(repo: Path | None, mode: str | None, rev: str | None, *, cache_dir: Path | None = None) -> Path:
    """`<cache>/reports/<repo name>-<hash of its path>/<run>`, run = staged | worktree | rev-<REV> |
    installed | default (no mode flag: staged or HEAD, decided when the snapshot is taken).

    The report must never land in the user's checkout (a `reports/` in their tree, or inside the
    package when run from a subfolder), so the default follows the repository, not the cwd."""
    from metax_audit.core.cachedir import cache_root

    if mode == "installed":
        top, name = Path(repo or "site-packages").resolve(), "installed"
    else:
        top = _repo_top(repo)
        name = top.name or "repo"
    run = f"rev-{rev}" if mode == "rev" and rev else (mode or "default")
    digest = hashlib.sha1(str(top).encode()).hexdigest()[:8]
    return cache_root(cache_dir) / "reports" / f"{_safe(name)}-{digest}" / _safe(run)


def default_probe_output_dir(what: str, *, cache_dir: Path | None = None) -> Path:
    """`<cache>/reports/probes/<backend or target>`: as a review's, a probe run's reports never land in
    the checkout it was started from (the current directory), unless --output-dir says so."""
    from metax_audit.core.cachedir import cache_root

    return cache_root(cache_dir) / "reports" / "probes" / _safe(what)


def _repo_top(repo: Path | None) -> Path:
    from metax_audit.stages.snapshot import find_repo

    return find_repo(repo or Path.cwd()).resolve()


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in text) or "_"


def ensure_writable(path: Path) -> Path:
    """Create `path` and prove a file can be written there, before any work starts."""
    if os.path.lexists(path) and not path.is_dir():
        raise ConfigError(f"output directory {path} exists and is not a directory (pass --output-dir DIR)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".metax-audit-write-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"output directory {path} is not writable: {exc.strerror or exc} "
                          "(pass --output-dir DIR)") from exc
    return path
