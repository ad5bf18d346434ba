# Every git command of the tool runs through here, so that nothing the audited repository configures
# ever executes: fsmonitor, hooks, filters, textconv, external diff, pager, ssh/askpass/credential helpers.
"""The one git wrapper.

A repository's own config (``.git/config``, and the ``.gitattributes`` it commits) can name programs
that git runs on its behalf: ``core.fsmonitor`` runs during any command that looks at the worktree
(``ls-files --others``, ``diff-index``), a filter driver's ``smudge``/``clean``/``process`` runs when
``checkout-index`` or ``archive`` writes a file that ``.gitattributes`` marks, ``diff.<driver>.textconv``
and ``diff.external`` run in diffs, and ``core.pager``, ``core.sshCommand``, ``core.askPass``,
``credential.helper``, ``gpg.program`` in the commands that use them. The tool reviews a repository it
must not trust, so:

- every command gets ``-c`` overrides (command-line config wins over every file) that turn each
  such setting off or into a harmless builtin (``false``), plus ``--no-pager``;
- the environment has no system config (``GIT_CONFIG_NOSYSTEM``), no system attributes, no prompt,
  no optional locks (no opportunistic index refresh), and the C locale;
- the drivers that ``.gitattributes`` can name (``filter.<name>.clean/smudge/process``,
  ``diff.<name>.textconv/command``, ``merge.<name>.driver``) are configured under names we cannot
  know in advance: before the first command that can look at the worktree, the names are read from
  the config (``git config --get-regexp``, which runs nothing) and each one's commands are emptied
  (git runs no driver whose command is empty) and ``required`` turned off;
- nothing is ever *written by git* from a blob: blobs are read raw with ``git cat-file --batch``
  (never ``--filters`` or ``--textconv``) and written by us (write_blobs); ``checkout-index``,
  ``archive`` and ``show`` are not used.

GitPython is not used for the same reason: it runs the same git binary with the repository's config."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from metax_audit.core import subproc

# Command-line config: the highest-priority scope, above the repository's, the user's and includes.
SAFE_CONFIG: tuple[str, ...] = (
    "core.fsmonitor=false",
    "core.useBuiltinFSMonitor=false",
    "core.hooksPath=/dev/null",
    "core.pager=cat",
    "core.editor=false",
    "sequence.editor=false",
    "core.sshCommand=false",
    "core.askPass=false",
    "core.gitProxy=false",
    "core.alternateRefsCommand=false",
    "credential.helper=",
    "diff.external=false",
    "gpg.program=false",
    "log.showSignature=false",
    "protocol.allow=never",
    "gc.auto=0",
    "maintenance.auto=false",
    "core.untrackedCache=false",
)
GIT_FLAGS: tuple[str, ...] = ("--no-pager", *(x for kv in SAFE_CONFIG for x in ("-c", kv)))
GIT_ENV: dict[str, str] = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_PAGER": "cat",
    "GIT_ASKPASS": "false",
    "SSH_ASKPASS": "false",
    "GIT_EXTERNAL_DIFF": "",
    "LC_ALL": "C",
}


# Subcommands that never apply attributes (no worktree file is hashed, no blob converted): they
# need no driver overrides, so the first question of a review (rev-parse) costs no config read.
_NO_ATTRIBUTES = frozenset({"rev-parse", "config", "merge-base", "describe", "ls-tree", "cat-file", "init", "version"})
_DRIVER_KEYS = {"filter": ("clean", "smudge", "process"), "diff": ("textconv", "command"), "merge": ("driver",)}
_DRIVERS: dict[str, tuple[str, ...]] = {}


def driver_flags(repo: Path) -> tuple[str, ...]:
    """`-c` overrides that empty every filter, diff and merge driver the config of `repo` defines
    (read once per repository path per process)."""
    key = str(repo)
    if key not in _DRIVERS:
        res = subproc.run(["git", *GIT_FLAGS, "-C", key, "config", "-z", "--name-only", "--get-regexp",
                           r"^(filter|diff|merge)\..+\."], env=GIT_ENV, timeout=60)
        names: set[tuple[str, str]] = set()
        for name in res.stdout.split("\0") if res.returncode == 0 else ():
            section, _, rest = name.partition(".")
            driver = rest.rpartition(".")[0]
            if section in _DRIVER_KEYS and driver:
                names.add((section, driver))
        flags: list[str] = []
        for section, driver in sorted(names):
            for var in _DRIVER_KEYS[section]:
                flags += ["-c", f"{section}.{driver}.{var}="]
            if section == "filter":
                flags += ["-c", f"filter.{driver}.required=false"]
        _DRIVERS[key] = tuple(flags)
    return _DRIVERS[key]


def command(repo: Path, *args: str) -> list[str]:
    """The argv of `git -C repo ARGS` with the safe flags (for the rare caller that runs it itself)."""
    drivers = driver_flags(repo) if args and args[0] not in _NO_ATTRIBUTES else ()
    return ["git", *GIT_FLAGS, *drivers, "-C", str(repo), *args]


def run(repo: Path, *args: str, input: str | None = None, timeout: float = 300,
        env: Mapping[str, str] | None = None) -> subproc.Completed:
    """`git -C repo ARGS` (text output), safely; a timeout is a result, a missing git a SubprocessError."""
    return subproc.run(command(repo, *args), env={**GIT_ENV, **(env or {})}, timeout=timeout, input=input)


def run_binary(repo: Path, *args: str, input: bytes | None = None, timeout: float = 600) -> tuple[int, bytes, str]:
    """`git -C repo ARGS` with binary stdout: (returncode, stdout, stderr); a timeout is a SubprocessError."""
    return subproc.run_binary(command(repo, *args), env=GIT_ENV, timeout=timeout, input=input)


@dataclass(frozen=True)
class TreeEntry:
    """One `git ls-tree -r` (or `ls-files --stage`) entry: mode, object id, repo-relative path."""

    mode: str
    oid: str
    path: str


def ls_tree(repo: Path, rev: str, *paths: str) -> list[TreeEntry]:
    """Every blob and gitlink of `rev` (recursively) under `paths` (all when none); a
    SubprocessError when git fails."""
    from metax_audit.core.errors import SubprocessError

    res = run(repo, "ls-tree", "-r", "-z", "--full-tree", rev, *(("--", *paths) if paths else ()))
    if res.returncode != 0:
        raise SubprocessError(f"git ls-tree {rev} failed: {(res.stderr.strip().splitlines() or [''])[-1]}",
                              stderr=res.stderr, returncode=res.returncode)
    out: list[TreeEntry] = []
    for record in res.stdout.split("\0"):
        if not record:
            continue
        meta, _, path = record.partition("\t")
        mode, _kind, oid = meta.split(" ")
        out.append(TreeEntry(mode, oid, path))
    return out


def read_blobs(repo: Path, oids: Iterable[str]) -> dict[str, bytes]:
    """The raw bytes of each blob (no filter, no textconv, no eol conversion), from one
    `git cat-file --batch`. Raises SubprocessError when git fails or a blob is missing."""
    from metax_audit.core.errors import SubprocessError

    wanted = list(dict.fromkeys(oids))
    if not wanted:
        return {}
    code, data, err = run_binary(repo, "cat-file", "--batch", input="".join(f"{o}\n" for o in wanted).encode())
    if code != 0:
        raise SubprocessError(f"git cat-file --batch failed ({code}): {(err.strip().splitlines() or [''])[-1]}",
                              stderr=err, returncode=code)
    blobs: dict[str, bytes] = {}
    pos = 0
    for oid in wanted:
        end = data.index(b"\n", pos)
        header = data[pos:end].decode("ascii", "replace").split(" ")
        if len(header) != 3:
            raise SubprocessError(f"git cat-file --batch: object {oid} is {' '.join(header[1:]) or 'unreadable'}")
        size = int(header[2])
        blobs[oid] = data[end + 1:end + 1 + size]
        pos = end + 1 + size + 1
    return blobs


def write_blobs(repo: Path, dest: Path, entries: Iterable[TreeEntry], place: Callable[[Path, str], Path]) -> int:
    """Write each regular-file entry (mode 100644 or 100755) under `dest` as its blob's raw bytes, at
    the path `place(dest, path)` returns (which refuses anything leaving `dest`), with the mode's
    permission bits; returns the number written. Other modes are the caller's (symlinks, gitlinks)."""
    files = [e for e in entries if e.mode in ("100644", "100755")]
    blobs = read_blobs(repo, (e.oid for e in files))
    for e in files:
        target = place(dest, e.path)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755 if e.mode == "100755" else 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(blobs[e.oid])
    return len(files)


@dataclass(frozen=True)
class IndexEntry:
    """One entry of the index as `git ls-files -z --stage` lists it."""

    mode: str
    blob: str
    stage: str
    path: str


def parse_stage(out: str) -> list[IndexEntry]:
    """`git ls-files -z --stage` output as entries (mode, blob, stage, path)."""
    entries = []
    for record in out.split("\0"):
        if not record:
            continue
        head, _, path = record.partition("\t")
        mode, blob, stage = [*head.split(" "), "", "", ""][:3]
        entries.append(IndexEntry(mode, blob, stage, path))
    return entries
