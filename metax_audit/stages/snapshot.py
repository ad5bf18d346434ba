# Read-only snapshots of what is under review: the git index, the working tree, a revision, or an
# installed distribution, exported into a temporary directory that is always removed.
from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from metax_audit.core import fstree, gitcmd, subproc, tempdirs
from metax_audit.core.config import AuditConfig, load_config
from metax_audit.core.errors import SnapshotError, SubprocessError
from metax_audit.core.models import SnapshotInfo, SnapshotMode, TestRun

if TYPE_CHECKING:
    from metax_audit.core.gitcmd import IndexEntry
    from metax_audit.core.memo import HeldTree, KeptTrees

# Every git call goes through gitcmd (no fsmonitor, hooks, filters or textconv of the audited repo
# ever run; GIT_OPTIONAL_LOCKS=0: no opportunistic index refresh). Blobs are read raw with
# cat-file --batch and written here: ls-files/ls-tree/cat-file/rev-parse/diff-index only read the repository.

MODES = ("staged", "worktree", "rev", "installed")


def _git(repo: Path, *args: str) -> subproc.Completed:
    return gitcmd.run(repo, *args)


# Within one review (remembered_git), the top of a path's repository and the commit of a revision are
# asked of git once: the staged review, its config, its output dir and its baseline all ask.
_REMEMBERED: dict[tuple[str, str], tuple[Path, Path | None, str | None]] | None = None
_HEADS: dict[tuple[str, str], str | None] | None = None
# The kept snapshots held now (root -> tree digest): resultcache.tree_digest without reading the files.
_KEPT_DIGESTS: dict[str, str] = {}


@contextmanager
def remembered_git() -> Iterator[None]:
    """Remember repository tops and revisions resolved while this is open (one review: one view of HEAD)."""
    global _REMEMBERED, _HEADS
    outer = _REMEMBERED, _HEADS
    if _REMEMBERED is None:
        _REMEMBERED, _HEADS = {}, {}
    try:
        yield
    finally:
        _REMEMBERED, _HEADS = outer


def _repo_facts(path: Path) -> tuple[Path, Path | None, str | None]:
    """(top of the work tree, its git dir, HEAD's commit or None) from one `git rev-parse`."""
    if not path.exists():
        raise SnapshotError(f"{path}: no such directory")
    if not os.access(path, os.R_OK | os.X_OK):
        raise SnapshotError(f"{path}: not readable")
    where = path if path.is_dir() else path.parent
    key = (str(where.absolute()), os.environ.get("GIT_DIR", ""))
    if _REMEMBERED is not None and key in _REMEMBERED:
        return _REMEMBERED[key]
    res = _git(where, "rev-parse", "--show-toplevel", "--absolute-git-dir", "--verify", "-q", "HEAD^{commit}")
    lines = res.stdout.split("\n")
    if res.returncode == 0 and len(lines) == 4 and not lines[3]:
        facts: tuple[Path, Path | None, str | None] = (Path(lines[0]), Path(lines[1]), lines[2] or None)
    elif res.returncode == 1 and len(lines) == 3 and not lines[2]:  # no commit yet (or HEAD not a commit)
        facts = (Path(lines[0]), Path(lines[1]), None)
    else:  # not a repository, or a path git prints differently: the plain question
        top = _git(where, "rev-parse", "--show-toplevel")
        if top.returncode != 0:
            raise SnapshotError(f"{path} is not inside a git repository (use --installed, or --repo PATH)")
        facts = (Path(top.stdout.strip()), None, _head(Path(top.stdout.strip())))
    if _REMEMBERED is not None and _HEADS is not None:
        _REMEMBERED[key] = facts
        _HEADS[(str(facts[0]), "HEAD")] = facts[2]
    return facts


def find_repo(path: Path) -> Path:
    """The top of the git work tree enclosing `path`; SnapshotError when there is none."""
    return _repo_facts(path)[0]


def _head(repo: Path, rev: str = "HEAD") -> str | None:
    res = _git(repo, "rev-parse", "--verify", "-q", f"{rev}^{{commit}}")
    return res.stdout.strip() or None if res.returncode == 0 else None


def resolve_commit(repo: Path, rev: str) -> str | None:
    """The commit `rev` names in `repo` (a repository top), None when it names none; HEAD is resolved
    once per review (remembered_git)."""
    key = (str(repo), rev)
    if _HEADS is not None and rev == "HEAD" and key in _HEADS:
        return _HEADS[key]
    sha = _head(repo, rev)
    if _HEADS is not None and rev == "HEAD":
        _HEADS[key] = sha
    return sha


def head_commit(repo: Path) -> str | None:
    return resolve_commit(repo, "HEAD")


def known_digest(root: Path) -> str | None:
    """resultcache.tree_digest of a kept snapshot held now (from its manifest), else None."""
    return _KEPT_DIGESTS.get(str(root))


def _is_dirty(repo: Path, head: str | None) -> bool:
    if head is None:
        return True
    res = _git(repo, "diff-index", "--quiet", "HEAD", "--")
    return res.returncode != 0


# `review --staged` with nothing staged reviews the index, which then is HEAD: said first, never an
# exit 2 (a pre-commit run over a clean index gates nothing new: exit 0 under --new-only).
NOTHING_STAGED = ("nothing is staged: the index equals HEAD {head}, so this review covers HEAD "
                  "and nothing in it is new in a change")


def _index_differs(repo: Path) -> bool:
    """Whether the index differs from HEAD (something is staged)."""
    return _git(repo, "diff-index", "--cached", "--quiet", "HEAD", "--").returncode != 0


def _dirty_and_staged(repo: Path, entries: list[IndexEntry]) -> tuple[bool, bool]:
    """(the work tree differs from HEAD, the index differs from HEAD), from the one `git diff-index
    HEAD` a staged review already ran for the first: each path it lists carries HEAD's blob and mode,
    which the index entries (read before) either match (a change in the work tree only) or not
    (staged). A path staged and then changed back in the work tree is listed too: its index entry's
    stat no longer matches the file."""
    res = _git(repo, "diff-index", "-z", "HEAD", "--")
    if res.returncode != 0:
        return True, _index_differs(repo)
    index = {e.path: e for e in entries}
    staged = any(e.stage != "0" for e in entries)
    fields = res.stdout.split("\0")
    dirty = bool(res.stdout)
    for meta, path in zip(fields[0::2], fields[1::2], strict=False):
        if staged:
            break
        parts = meta.lstrip(":").split()
        if len(parts) < 5:
            return dirty, _index_differs(repo)  # not the format read here: ask git plainly
        old_mode, old_blob, status = parts[0], parts[2], parts[4]
        entry = index.get(path)
        staged = entry is None or status.startswith("A") or entry.blob != old_blob or entry.mode != old_mode
    return dirty, staged


def has_staged_changes(repo: Path) -> bool:
    head = head_commit(repo)
    if head is None:
        return bool(_index_entries(repo))
    return _index_differs(repo)


def _index_entries(repo: Path) -> list[IndexEntry]:
    """Every index entry (mode, blob, stage, path), from one `git ls-files --stage`."""
    from metax_audit.core.gitcmd import parse_stage

    res = _git(repo, "ls-files", "-z", "--stage")
    if res.returncode != 0:
        raise SnapshotError(f"git ls-files failed: {res.stderr.strip()}")
    return parse_stage(res.stdout)


@dataclass(frozen=True)
class PythonSourcesOf:
    """A directory of which only the Python sources are exported: every static stage lists and reads a
    package's files by their .py suffix, so its other files (the port's 253 JSON kernel configs, 3.7 MB of
    its 584 exported files) would be written and removed for nothing."""

    path: str
    suffixes: tuple[str, ...] = (".py", ".pyi")

    def __str__(self) -> str:
        return self.path


Exported = str | PythonSourcesOf  # one path of an export selection


def _selected(path: str, only: tuple[Exported, ...]) -> bool:
    if not only:
        return True
    for o in only:
        if isinstance(o, PythonSourcesOf):
            if path.startswith(o.path.rstrip("/") + "/") and path.endswith(o.suffixes):
                return True
        elif path == o or path.startswith(o.rstrip("/") + "/"):
            return True
    return False


# A path longer than this (repo-relative, in bytes) is not exported: below a temp or cache dir it
# would pass PATH_MAX (4,096) somewhere along the way (a 2,000-deep directory is 4,000 bytes). The
# snapshot's notes name what was left out, so the bound is reported, never silent.
MAX_PATH_BYTES = 1024


def _bounded(paths: list[str]) -> tuple[set[str], list[str]]:
    """The paths past MAX_PATH_BYTES, and the note that says so (none when there are none)."""
    long = {p for p in paths if len(os.fsencode(p)) > MAX_PATH_BYTES}
    if not long:
        return long, []
    first = min(long)
    shown = first if len(first) <= 120 else first[:60] + "..." + first[-40:]
    return long, [f"{len(long)} file(s) not exported: a path longer than {MAX_PATH_BYTES} bytes (first: {shown})"]


def _export_index(repo: Path, dest: Path, entries: list[IndexEntry], only: tuple[Exported, ...] = ()) -> tuple[int, list[str]]:
    """Write the selected index entries under `dest` as their blobs' raw bytes (write_entries)."""
    selected = [e for e in entries if _selected(e.path, only)]
    unmerged = sorted({e.path for e in selected if e.stage != "0"})
    if unmerged:
        raise SnapshotError(f"{unmerged[0]} is unmerged in the index (resolve the conflict, then stage it)")
    return write_entries(repo, dest, [gitcmd.TreeEntry(e.mode, e.blob, e.path) for e in selected])


def write_entries(repo: Path, dest: Path, entries: list[gitcmd.TreeEntry]) -> tuple[int, list[str]]:
    """Write index or tree entries under `dest`: regular files as their blobs' raw bytes (no filter,
    smudge or eol conversion of the repo's attributes ever runs or applies), symlinks as links to the
    blob's text (_contain_links then judges them), gitlinks as empty directories. Every path goes
    through _place. Returns (files written, notes)."""
    count = gitcmd.write_blobs(repo, dest, entries, _place)
    links = [e for e in entries if e.mode == "120000"]
    targets = gitcmd.read_blobs(repo, (e.oid for e in links))
    notes: list[str] = []
    for e in links:
        os.symlink(os.fsdecode(targets[e.oid]), _place(dest, e.path))
        count += 1
    for e in entries:
        if e.mode == "160000":
            _mkdir_in(dest, e.path)
            notes.append(f"submodule {e.path} exported as an empty directory (gitlink only)")
    return count, notes


def _place(root: Path, rel: str) -> Path:
    """The path where `rel` goes inside the snapshot `root`, with its parent directories created.

    Every write into a snapshot goes through here. It refuses (SnapshotError) any path that would
    resolve outside `root`: absolute, `..`, or a parent that is a symlink or a file. Existing parents
    are checked with lstat, never followed, so nothing is ever written beneath a symlink."""
    pure = PurePosixPath(rel)
    if pure.is_absolute() or not pure.parts or any(p in ("", ".", "..") for p in pure.parts):
        raise SnapshotError(f"refusing to export {rel!r}: it would leave the snapshot")
    here = root
    for part in pure.parts[:-1]:
        here = here / part
        try:
            mode = os.lstat(here).st_mode
        except FileNotFoundError:
            os.mkdir(here)
            continue
        if not stat.S_ISDIR(mode):
            raise SnapshotError(f"refusing to export {rel!r}: {here.relative_to(root)} is not a directory in the snapshot")
    target = here / pure.parts[-1]
    if os.path.lexists(target):
        raise SnapshotError(f"refusing to export {rel!r}: it is already in the snapshot")
    return target


def _link_inside(root: Path, rel: str, link: str) -> bool:
    """Whether a symlink at `rel` with target `link` resolves (lexically) inside `root`."""
    if os.path.isabs(link):
        return False
    joined = os.path.normpath(os.path.join(os.path.dirname(rel), link))
    return joined != ".." and not joined.startswith("../") and not os.path.isabs(joined)


def _symlinked_parent(repo: Path, rel: str) -> str | None:
    """The first parent directory of `rel` in `repo` that is a symlink (never followed), else None."""
    here = repo
    parts = PurePosixPath(rel).parts
    for i, part in enumerate(parts[:-1]):
        here = here / part
        try:
            if stat.S_ISLNK(os.lstat(here).st_mode):
                return "/".join(parts[: i + 1])
        except OSError:
            return None
    return None


def _contain_links(root: Path) -> list[str]:
    """Record every symlink in an exported snapshot; remove those whose target leaves it.

    A symlink is user state: it is recorded with its target, and one that leaves the repository is
    never followed (a later stage could otherwise read a file outside the repo as a port file)."""
    notes: list[str] = []
    for dirpath, dirnames, filenames in fstree.walk(root):  # os.walk never descends into symlinked dirs
        for name in sorted(dirnames + filenames):
            full = Path(dirpath) / name
            if not full.is_symlink():
                continue
            rel = full.relative_to(root).as_posix()
            link = os.readlink(full)
            resolved = os.path.realpath(full)
            if _link_inside(root, rel, link) and (resolved == str(root) or resolved.startswith(str(root) + os.sep)):
                notes.append(f"symlink {rel} -> {link} (inside the repository)")
            else:
                full.unlink()
                notes.append(f"symlink {rel} -> {link} leaves the repository: recorded, not followed")
    return notes


def _worktree_paths(repo: Path, only: tuple[Exported, ...]) -> tuple[list[str], set[str]]:
    """The worktree's tracked and untracked-not-ignored paths in the selection, sorted, and the gitlinks."""
    entries = _index_entries(repo)
    res = _git(repo, "ls-files", "-z", "--others", "--exclude-standard")
    if res.returncode != 0:
        raise SnapshotError(f"git ls-files failed: {res.stderr.strip()}")
    paths = {e.path for e in entries} | {p for p in res.stdout.split("\0") if p}
    return sorted(p for p in paths if _selected(p, only)), {e.path for e in entries if e.mode == "160000"}


def _export_worktree(repo: Path, dest: Path, rels: list[str], gitlinks: set[str]) -> tuple[int, list[str]]:
    notes: list[str] = []
    count = 0
    skipped_under: dict[str, int] = {}
    for rel in rels:
        src = repo / rel
        if rel in gitlinks:
            _mkdir_in(dest, rel)
            notes.append(f"submodule {rel} exported as an empty directory (its files belong to another repository)")
            continue
        linked = _symlinked_parent(repo, rel)
        if linked is not None:
            # Tracked below a directory the worktree replaced by a symlink: not in the worktree as a
            # file (git status shows it deleted); the symlink itself is recorded on its own.
            skipped_under[linked] = skipped_under.get(linked, 0) + 1
            continue
        try:
            st = os.lstat(src)
        except FileNotFoundError:
            continue  # deleted in the worktree but still in the index: the worktree no longer has it
        if stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(src), _place(dest, rel))
        elif stat.S_ISREG(st.st_mode):
            target = _place(dest, rel)
            with open(src, "rb") as fin, open(target, "xb") as fout:  # "x": never through an existing link
                shutil.copyfileobj(fin, fout)
            os.chmod(target, stat.S_IMODE(st.st_mode))
        else:
            continue
        count += 1
    for linked, n in sorted(skipped_under.items()):
        link = os.readlink(repo / linked)
        where = "inside the repository" if _link_inside(repo, linked, link) else "leaves the repository: recorded, not followed"
        notes.append(f"{linked} is a symlink in the worktree (-> {link}, {where}): "
                     f"{n} tracked file(s) below it not exported")
    return count, notes


def _mkdir_in(root: Path, rel: str) -> None:
    """An empty directory at `rel` inside the snapshot (a gitlink), through _place's checks."""
    target = _place(root, rel)
    target.mkdir()


def _export_rev(repo: Path, rev: str, dest: Path, only: tuple[Exported, ...] = ()) -> tuple[str, int, list[str]]:
    resolved = _git(repo, "rev-parse", "--verify", "-q", f"{rev}^{{commit}}")
    if resolved.returncode != 0 or not resolved.stdout.strip():
        raise SnapshotError(f"unknown revision {rev!r} in {repo}")
    sha = resolved.stdout.strip()
    pathspecs: list[str] = []
    if only:
        top_names = set(_git(repo, "ls-tree", "--name-only", "-z", sha).stdout.split("\0"))
        pathspecs = [str(o) for o in only if str(o).split("/")[0] in top_names]
        if not pathspecs:
            return sha, 0, [f"none of {', '.join(map(str, only))} exists at {rev}"]
    try:
        entries = [e for e in gitcmd.ls_tree(repo, sha, *pathspecs) if _selected(e.path, only)]
    except SubprocessError as exc:
        raise SnapshotError(f"reading {rev} failed: {exc}") from exc
    long, notes = _bounded([e.path for e in entries])
    kept: list[gitcmd.TreeEntry] = []
    for e in entries:
        if e.path in long:
            continue
        if e.mode == "120000":
            target = gitcmd.read_blobs(repo, [e.oid])[e.oid].decode(errors="surrogateescape")
            if not _link_inside(dest, e.path, target):
                notes.append(f"symlink {e.path} -> {target} leaves the repository: recorded, not followed")
                continue
        elif e.mode == "160000":
            notes.append(f"submodule {e.path} not exported (a gitlink has no files in this repository)")
            continue
        kept.append(e)
    try:
        count, _ = write_entries(repo, dest, kept)
    except SubprocessError as exc:
        raise SnapshotError(f"reading {rev} failed: {exc}") from exc
    return sha, count, notes


_INSTALLED_SCRIPT = r"""
import importlib.metadata as md, json, sys, os
top = sys.argv[1]
names = md.packages_distributions().get(top, [])
if not names:
    print(json.dumps({"error": f"no installed distribution provides {top!r}"})); sys.exit(0)
dist = md.distribution(names[0])
files = [str(f) for f in (dist.files or []) if str(f).split("/")[0] == top]
base = str(dist.locate_file(""))
tag = None
for f in dist.files or []:
    if str(f).endswith(".dist-info/WHEEL"):
        for line in dist.locate_file(f).read_text().splitlines():
            if line.startswith("Tag:"):
                tag = line.split(":", 1)[1].strip(); break
direct = dist.read_text("direct_url.json")
print(json.dumps({"name": dist.metadata["Name"], "version": dist.version, "base": base, "files": files,
                  "wheel_tag": tag, "direct_url": json.loads(direct) if direct else None}))
"""


def _export_installed(package: str, dest: Path, python: str | None) -> tuple[dict, int]:
    # Located through importlib.metadata in the target interpreter; the package is never imported.
    res = subproc.run_python(python or sys.executable, ["-c", subproc.fenced_code(_INSTALLED_SCRIPT), package.split(".")[0]],
                             timeout=120, never_import=(package.split(".")[0],))
    if res.returncode != 0:
        raise SnapshotError(f"could not query the installed distribution of {package}: {res.stderr.strip()[-300:]}")
    info = json.loads(res.stdout)
    if "error" in info:
        raise SnapshotError(info["error"] + " (install it, or review a git checkout instead)")
    base = Path(info["base"])
    count = 0
    for rel in info["files"]:
        src = base / rel
        if src.suffix != ".py" or not src.is_file():
            continue
        if src.is_symlink():
            continue  # never followed: what a symlink in site-packages points at is not the package
        with open(src, "rb") as fin, open(_place(dest, rel), "xb") as fout:
            shutil.copyfileobj(fin, fout)
        count += 1
    if count == 0 and info.get("direct_url"):
        raise SnapshotError(f"{info['name']} is an editable install ({info['direct_url'].get('url')}): review its git checkout with --worktree instead")
    return info, count


@contextmanager
def snapshot(
    mode: SnapshotMode,
    repo: Path | None = None,
    rev: str | None = None,
    *,
    package: str = "vllm_metax",
    python: str | None = None,
    only: tuple[Exported, ...] = (),
    keep: KeptTrees | None = None,
) -> Iterator[SnapshotInfo]:
    """Export the subject under review into a temp dir, yield its record, always remove it.

    The user's repository is only read: no index refresh, stash, worktree, branch or checkout.
    `only` limits the export to these top-level paths (the port package and its config), which is
    what the static stages read; `--test` needs the whole tree and passes none. With `keep` (the pipeline's
    kept snapshots), a staged or worktree review reads the snapshot kept there (kept_snapshot.py), updated by what
    changed and locked for the review, when the tree is plain and no other review holds it; the files
    are the same a fresh export writes.
    """
    if mode not in MODES:
        raise SnapshotError(f"unknown snapshot mode {mode!r} (one of {', '.join(MODES)})")
    tempdirs.reclaim()  # what killed runs left in the temp dir (their process is gone)
    held = None
    tmp: Path | None = None
    try:
        notes: list[str] = []
        if mode == "installed":
            tmp = tempdirs.make("snap")
            info, count = _export_installed(package, tmp, python)
            snap = SnapshotInfo(
                mode=mode, repo=info["base"], commit=None, dirty=False, root=tmp,
                label=f"{info['name']}=={info['version']}" + (f" ({info['wheel_tag']})" if info.get("wheel_tag") else ""),
                files=count,
            )
        else:
            top, gitdir, _ = _repo_facts(repo or Path.cwd())
            head = head_commit(top)
            if mode in ("staged", "worktree"):
                export: Callable[[Path], tuple[int, list[str]]]
                if mode == "staged":
                    entries = _index_entries(top)
                    if not entries:
                        raise SnapshotError(f"{top}: the index is empty, nothing is staged (stage files with git add, or use --worktree)")
                    long, bound_notes = _bounded([e.path for e in entries])
                    every_entry, entries = entries, [e for e in entries if e.path not in long]
                    held = _hold_kept(keep, top, gitdir, entries, only) if keep is not None else None
                    export = partial(_export_index, top, entries=entries, only=only)
                else:
                    rels, gitlinks = _worktree_paths(top, only)
                    long, bound_notes = _bounded(rels)
                    rels = [r for r in rels if r not in long]
                    held = _hold_kept_worktree(keep, top, rels, gitlinks) if keep is not None else None
                    export = partial(_export_worktree, top, rels=rels, gitlinks=gitlinks)
                if held is not None:  # the kept snapshot, brought up to date (kept_snapshot.py)
                    root, count = held.root, held.count
                    _KEPT_DIGESTS[str(root)] = held.digest
                else:
                    root = tmp = tempdirs.make("snap")
                    count, notes = export(tmp)
                    notes += _contain_links(tmp)
                label = "index" if mode == "staged" else "worktree"
                if mode == "staged" and head is not None:
                    dirty, staged = _dirty_and_staged(top, every_entry)
                    if not staged:
                        notes = [NOTHING_STAGED.format(head=head[:12]), *notes]
                else:
                    dirty = _is_dirty(top, head)
                snap = SnapshotInfo(mode, str(top), head, dirty, root, label, count, (*bound_notes, *notes))
            else:
                if not rev:
                    raise SnapshotError("--rev needs a revision")
                if head is None and rev:
                    raise SnapshotError(f"unknown revision {rev!r}: {top} has no commits yet (use --staged)")
                tmp = tempdirs.make("snap")
                sha, count, notes = _export_rev(top, rev, tmp, only)
                notes += _contain_links(tmp)
                snap = SnapshotInfo(mode, str(top), sha, False, tmp, rev, count, tuple(notes))
        yield snap
    finally:
        if held is not None:
            _KEPT_DIGESTS.pop(str(held.root), None)
            held.release()
        if tmp is not None:
            tempdirs.remove_soon(tmp)


def _hold_kept_worktree(keep: KeptTrees, top: Path, rels: list[str], gitlinks: set[str]) -> HeldTree | None:
    """The kept snapshot of the worktree's selected files, or None (as _hold_kept)."""
    if not rels or gitlinks.intersection(rels):
        return None
    return keep.hold_worktree(top, rels)


def _hold_kept(keep: KeptTrees, top: Path, gitdir: Path | None, entries: list[IndexEntry], only: tuple[Exported, ...],
               ) -> HeldTree | None:
    """The kept snapshot of the selected index entries, or None: not a plain tree, or held by another review."""
    selected = [e for e in entries if _selected(e.path, only)]
    if gitdir is None or not selected:
        return None
    return keep.hold_index(top, gitdir, entries, selected)


def default_mode(repo: Path | None) -> tuple[SnapshotMode, str | None, str]:
    """`review` with no mode flag: the index when something is staged, else HEAD (with a note why)."""
    top = find_repo(repo or Path.cwd())
    if has_staged_changes(top):
        return "staged", None, ""
    if head_commit(top) is None:
        raise SnapshotError(f"{top} has no commits and nothing staged: nothing to review")
    return "rev", "HEAD", "nothing is staged, so the review covers HEAD"


def run_test_command(command: str, root: Path, timeout: float = 1800) -> TestRun:
    """Run the port's own tests against the snapshot: cwd is the snapshot, first on PYTHONPATH."""
    import time

    env = {"PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "PYTHONDONTWRITEBYTECODE": "1"}
    start = time.perf_counter()
    res = subproc.run(["/bin/sh", "-c", command], cwd=root, env=env, timeout=timeout)
    tail = (res.stdout + res.stderr)[-4000:]
    code = res.returncode if not res.timed_out else 124
    return TestRun(command=command, exit_code=code, seconds=round(time.perf_counter() - start, 2), output_tail=tail)


def port_package_hint(repo: Path | None, mode: str, config_file: Path | None) -> str:
    """The port package to export, needed before the snapshot exists (see export_config)."""
    return export_config(repo, mode, config_file).port_package


def export_config(repo: Path | None, mode: str, config_file: Path | None) -> AuditConfig:
    """The config that says what to export (port package, C++ sources, stack pins), needed before the
    snapshot exists: --config, else the repo's own config as it is in the working tree, else the
    default. The snapshot's config still governs the review; a port package renamed between the
    worktree and the reviewed revision is reported by discover as a missing package."""
    if config_file is not None:
        return load_config(Path("."), config_file)
    if mode != "installed":
        return load_config(find_repo(repo or Path.cwd()))
    return AuditConfig()


def static_export(package: str, config: AuditConfig | None = None) -> tuple[Exported, ...]:
    """What a static review exports: the port package's Python sources, its config, the port's C++ sources
    (op registrations) and the files that pin its kernel stack."""
    config = config or AuditConfig()
    return (PythonSourcesOf(package.replace(".", "/")), "pyproject.toml", ".metax-audit.yaml", *config.native_sources,
            *config.stack_files)
