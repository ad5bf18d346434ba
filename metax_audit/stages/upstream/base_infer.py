# Without --base: the upstream release the port was last synced to, read from the port's own history.
# A port declares the release it follows (a pin `vllm==X` in requirements/pyproject/setup.py, or its own
# version when that is the upstream release's, as in setup.py's `return "0.26.0"`); the base is what it
# declared before the last commit that changed the declaration to the release under review.
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# Files that may declare it, pins first (an explicit upstream pin says more than the port's own version).
_PIN_FILES = ("requirements.txt", "requirements/common.txt", "requirements/cuda.txt", "pyproject.toml", "setup.py")
_VERSION_FILES = ("setup.py", "pyproject.toml", "VERSION", "{pkg}/version.py", "{pkg}/_version.py", "{pkg}/__init__.py")
_VERSION_TEXT = r"(\d+\.\d+(?:\.\d+)?(?:\.post\d+|rc\d+)?)"
_MAX_COMMITS = 300


@dataclass(frozen=True)
class BaseGuess:
    """The inferred base release, or why none was inferred (version None)."""

    version: str | None
    evidence: str


def infer_base(repo: Path, rev: str, target: str, upstream_package: str, port_package: str, shown: str = "") -> BaseGuess:
    """The release the port at `rev` (named `shown` in the evidence) was last synced to, when its history
    says so; `target` is the upstream release under review (--upstream)."""
    pkg = port_package.replace(".", "/")
    shown = shown or rev
    skipped = ""
    candidates = [(f, "pin") for f in _PIN_FILES] + [(f.format(pkg=pkg), "own") for f in _VERSION_FILES]
    for path, kind in candidates:
        now = _declared(_show(repo, rev, path), path, kind, upstream_package)
        if now is None:
            continue
        what = f"{path} pins {upstream_package}=={now}" if kind == "pin" else f"{path} declares the port's version {now}"
        if kind == "own" and _key(now) != _key(target):
            # The port's own version is taken as the release it follows only when it is the one under review.
            skipped = skipped or f"; {what}, not the {upstream_package} {target} under review"
            continue
        if _key(now) < _key(target):
            return BaseGuess(now, f"inferred from the port's history: at {shown} {what}, older than {target}")
        if _key(now) > _key(target):
            return BaseGuess(None, f"not inferred: at {shown} {what}, newer than the upstream {target} under review")
        return _before_last_change(repo, rev, path, kind, upstream_package, target, what, shown)
    return BaseGuess(None, f"not inferred: the port at {shown} pins no {upstream_package} release "
                           f"(in {', '.join(_PIN_FILES)}){skipped}")


def _before_last_change(repo: Path, rev: str, path: str, kind: str, upstream_package: str, target: str, what: str,
                        shown: str) -> BaseGuess:
    """What `path` declared just before the newest commit that set the declaration to `target`."""
    change = _change_to(repo, rev, path, kind, upstream_package, target)
    if change is None:
        return BaseGuess(None, f"not inferred: at {shown} {what}, and no commit in its history changed it to {target}")
    sha, subject, now, before = change
    if before is None or _key(before) > _key(target):
        return BaseGuess(None, f"not inferred: at {shown} {what}; before the commit that set it ({_short(subject)}) "
                               f"it declared {before or 'nothing readable'}")
    return BaseGuess(before, f"inferred from the port's history: at {shown} {what}; it declared {before} before "
                             f"{sha[:7]} ({_short(subject)}) changed it to {now}")


def _change_to(repo: Path, rev: str, path: str, kind: str, upstream_package: str, target: str,
               ) -> tuple[str, str, str, str | None] | None:
    """The newest commit in the history of `rev` that changed what `path` declares to `target`: (sha, subject,
    what it declared then, what it declared before); None when no commit within _MAX_COMMITS did."""
    log = _git(repo, "log", f"--max-count={_MAX_COMMITS}", "--format=%H%x09%s", rev, "--", path)
    for entry in (log or "").splitlines():
        sha, _, subject = entry.partition("\t")
        now = _declared(_show(repo, sha, path), path, kind, upstream_package)
        if now is None or _key(now) != _key(target):
            continue
        before = _declared(_show(repo, f"{sha}^", path), path, kind, upstream_package)
        if before is not None and _key(before) == _key(target):
            continue  # this commit did not change the declaration; an older one did
        return sha, subject, now, before
    return None


def _declared(text: str | None, path: str, kind: str, upstream_package: str) -> str | None:
    """The release a file declares: a pin of the upstream package, or (kind "own") the port's own version."""
    if text is None:
        return None
    name = re.escape(upstream_package).replace("_", "[-_]")
    if kind == "pin":
        m = re.search(rf"(?m)^[^#\n]*?[\"']?\b{name}\s*(?:==|~=|===)\s*{_VERSION_TEXT}", text)
        return m.group(1) if m else None
    if path.endswith("setup.py"):
        # `def fixed_version_scheme(...): return "0.26.0"` or `setup(version="0.26.0")`
        m = re.search(rf"def \w*version\w*\([^)]*\)[^:]*:(?:\s*(?:#[^\n]*|\"\"\"[\s\S]*?\"\"\"))*\s*return [\"']{_VERSION_TEXT}[\"']", text) \
            or re.search(rf"\bversion\s*=\s*[\"']{_VERSION_TEXT}[\"']", text)
    elif path.endswith("pyproject.toml"):
        m = re.search(rf"(?m)^version\s*=\s*[\"']{_VERSION_TEXT}[\"']", text)
    elif path.endswith("VERSION"):
        m = re.match(rf"\s*v?{_VERSION_TEXT}\s*$", text)
    else:
        m = re.search(rf"(?m)^__version__\s*=\s*[\"']{_VERSION_TEXT}[\"']", text)
    return m.group(1) if m else None


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version.split("rc")[0].split(".post")[0])[:3])


def _show(repo: Path, rev: str, path: str) -> str | None:
    return _git(repo, "cat-file", "blob", f"{rev}:{path}")  # raw: `show` could run a textconv


def _git(repo: Path, *args: str) -> str | None:
    from metax_audit.core import gitcmd
    from metax_audit.core.errors import SubprocessError

    try:
        done = gitcmd.run(repo, *args, timeout=60)
    except SubprocessError:
        return None
    return done.stdout if done.returncode == 0 and not done.timed_out else None


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class SyncPoint:
    """The commit at which the port moved to the base release (its previous sync), and how that is known."""

    commit: str
    evidence: str


def previous_sync(repo: Path, rev: str, base: str, upstream_package: str, port_package: str) -> SyncPoint | None:
    """The newest commit in the history of `rev` that changed the port's declaration (a pin of the upstream
    package, or the port's own version) to the base release: the port as its previous sync left it. None when
    the history does not say (no declaration, or none was ever set to `base`)."""
    pkg = port_package.replace(".", "/")
    candidates = [(f, "pin") for f in _PIN_FILES] + [(f.format(pkg=pkg), "own") for f in _VERSION_FILES]
    for path, kind in candidates:
        if _declared(_show(repo, rev, path), path, kind, upstream_package) is None:
            continue
        change = _change_to(repo, rev, path, kind, upstream_package, base)
        if change is None:
            return None
        sha, subject, _, _ = change
        return SyncPoint(sha, f"{sha[:7]} ({_short(subject)}) set {path} to {base}")
    return None


def file_at(repo: Path, commit: str, path: str) -> str | None:
    """A file's text at a commit (raw blob: no textconv), None when absent or unreadable."""
    return _show(repo, commit, path)
