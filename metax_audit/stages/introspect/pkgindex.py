# The package index as pip is configured here (its config files, PIP_* variables, $METAX_AUDIT_FIND_LINKS):
# find one release's file through the simple API (PEP 503/691) or a find-links folder, download it, check its hash.
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

# Why unearth (pdm's finder) and not hand-written index parsing, nor pypi-simple: it reads PEP 503 HTML and
# PEP 691 JSON pages, file:// indexes and find-links folders alike, evaluates candidates with `packaging`
# (names, versions, yanked files, hashes in the link), and downloads with hash checking; it never builds or
# imports what it finds. pypi-simple parses pages only (no find-links folders, no file:// index, no download
# with hash check) and brings beautifulsoup4, pydantic and requests along. unearth is pure Python.

FIND_LINKS_ENV = "METAX_AUDIT_FIND_LINKS"  # folders (or URLs) of wheels/sdists, os.pathsep-separated, tried first
DEFAULT_INDEX = "https://pypi.org/simple/"
PIP_CONFIG_TIMEOUT_S = 60


@dataclass(frozen=True)
class IndexSource:
    url: str  # a find-links folder or URL, or an index's simple URL
    kind: str  # "find-links" | "index"
    origin: str  # where it was configured: "$METAX_AUDIT_FIND_LINKS", "pip config global.find-links", "--index-url"...


@dataclass(frozen=True)
class Sources:
    sources: tuple[IndexSource, ...]
    skipped: tuple[str, ...] = ()  # configured but absent (a local index folder that does not exist), with why
    absent: tuple[IndexSource, ...] = ()  # the sources `skipped` names (a folder that appears later is asked then)

    def describe(self) -> str:
        return ", ".join(f"{s.url} ({s.origin})" for s in self.sources) or "no index"


@dataclass(frozen=True)
class Fetched:
    path: Path  # the downloaded (or local) file
    filename: str
    version: str
    sha256: str  # of the file's bytes, computed here
    source: str  # the index or folder it came from
    verified: bool  # the index published a hash and the file matched it


@dataclass(frozen=True)
class NotFetched:
    why: str  # one clause: what was asked where, and what each source answered
    definitive: bool  # every source answered (none was unreachable): safe to remember


def _split(value: str) -> list[str]:
    return [v for v in re.split(r"\s+", value.strip()) if v]


def pip_settings(python: str | None = None) -> tuple[dict[str, str], str]:
    """pip's own reading of its config files and PIP_* variables (`pip config list`: key -> value, keys such
    as `global.index-url`, `download.find-links`, `:env:.find-links`), and a note when pip could not say
    (then the PIP_* variables are read directly). Asked of pip so that the files, their order and the
    variables are pip's, whatever its version."""
    from metax_audit.core import subproc

    done = subproc.run_python(python or sys.executable, ["-m", "pip", "config", "list"], timeout=PIP_CONFIG_TIMEOUT_S)
    if done.returncode != 0 or done.timed_out:
        env = {f":env:.{k[4:].lower().replace('_', '-')}": v for k, v in os.environ.items() if k.startswith("PIP_")}
        return env, "pip config list failed: PIP_* variables read directly"
    out: dict[str, str] = {}
    for line in done.stdout.splitlines():
        m = re.match(r"^([^=\s]+)=(['\"]?)(.*)\2$", line.strip())
        if m:
            out[m.group(1)] = m.group(3)
    return out, ""


PIP_SETTINGS_DIR = "pip-settings"  # under the stack cache: a fact of the environment, like the stack's


def kept_pip_settings() -> dict[str, str]:
    """pip_settings()'s answer for this interpreter, kept in the stack cache under config_identity(): the
    digest of every input of that answer (pip's config files, the PIP_* variables, this interpreter and its
    pip), so an equal identity is the same answer; a `pip config list` costs 0.3-0.6 s of CPU per review.
    Where the identity cannot be had (not Linux) or pip could not answer, pip is asked and nothing is kept."""
    import json

    from metax_audit.core import inputs
    from metax_audit.stages.introspect.cache import stack_cache_dir

    identity = config_identity()
    path = stack_cache_dir() / PIP_SETTINGS_DIR / f"{identity}.json" if identity is not None else None
    if path is not None:
        try:
            kept = json.loads(inputs.read_text(path, follow_symlinks=False))
        except (OSError, ValueError):
            kept = None
        if isinstance(kept, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in kept.items()):
            return kept
    settings, note = pip_settings()
    if path is not None and not note:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(settings, sort_keys=True) + "\n", encoding="utf-8")
            os.replace(tmp, path)  # atomic: a concurrent review reads no entry or the whole one
        except OSError:
            pass  # a read-only cache only costs the next review its speed
    return settings


def configured_sources(*, index_url: str | None = None, find_links: Sequence[str] = (),
                       settings: dict[str, str] | None = None) -> Sources:
    """Where a release is looked for, in order: $METAX_AUDIT_FIND_LINKS, the given find-links, pip's
    find-links, then the index (the given one, else pip's index-url, else PyPI) and pip's extra indexes
    (none of them with no-index). Local folders and file:// indexes that do not exist are skipped, and said."""
    settings = kept_pip_settings() if settings is None else settings

    def setting(key: str) -> tuple[str, str] | None:
        for scope in (":env:", "download", "global"):  # pip: variables over the command's section over [global]
            if f"{scope}.{key}" in settings:
                return settings[f"{scope}.{key}"], ("PIP_" + key.upper().replace("-", "_") if scope == ":env:"
                                                    else f"pip config {scope}.{key}")
        return None

    found: list[IndexSource] = []
    found += [IndexSource(p, "find-links", f"${FIND_LINKS_ENV}") for p in os.environ.get(FIND_LINKS_ENV, "").split(os.pathsep) if p]
    found += [IndexSource(p, "find-links", "--find-links") for p in find_links]
    if (links := setting("find-links")) is not None:
        found += [IndexSource(p, "find-links", links[1]) for p in _split(links[0])]
    no_index = setting("no-index")
    if not (no_index and no_index[0].lower() in ("1", "true", "yes", "on")):
        main = (index_url, "--index-url") if index_url else setting("index-url") or (DEFAULT_INDEX, "the default index")
        found += [IndexSource(u, "index", main[1]) for u in _split(main[0])[:1]]
        if (extra := setting("extra-index-url")) is not None:
            found += [IndexSource(u, "index", extra[1]) for u in _split(extra[0])]
    kept: list[IndexSource] = []
    skipped: list[str] = []
    absent: list[IndexSource] = []
    for s in dict.fromkeys(found):
        local = _local_path(s.url)
        if local is not None and not local.exists():
            skipped.append(f"{s.url} ({s.origin}) does not exist")
            absent.append(s)
        else:
            kept.append(s)
    return Sources(tuple(kept), tuple(skipped), tuple(absent))


def config_identity(index_url: str | None = None) -> str | None:
    """A digest of everything configured_sources' answer depends on, read without asking pip (a `pip config
    list` costs 0.6 s): the given index URL, $METAX_AUDIT_FIND_LINKS, every PIP_* variable and the variables
    that place pip's config files, the bytes of each file pip reads its configuration from ($PIP_CONFIG_FILE,
    the site file of this interpreter, the user and the global files), and the interpreter and pip that
    answer. Two equal identities mean the same configured sources, so an answer of the index kept under one
    (stack_pins: a release found on none of them) is the answer under the other. None where the files are
    not known to be those (pip's locations here are its Linux ones): then nothing is kept."""
    if not sys.platform.startswith("linux"):
        return None
    import importlib.metadata

    from metax_audit.core import inputs

    home = Path(os.environ.get("HOME") or Path.home())
    user = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    dirs = [Path(d) for d in (os.environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep) if d]
    files: list[str | Path] = [os.environ.get("PIP_CONFIG_FILE", ""), Path(sys.prefix) / "pip.conf", user / "pip" / "pip.conf",
             home / ".pip" / "pip.conf", *(d / "pip" / "pip.conf" for d in dirs), Path("/etc/pip.conf")]
    h = hashlib.sha256()
    for name in files:
        if not name or str(name) == os.devnull:
            h.update(f"{name}|-\n".encode())
            continue
        try:
            state = hashlib.sha256(inputs.read_bytes(Path(name))).hexdigest()  # a FIFO is refused, never waited on
        except FileNotFoundError:
            state = "absent"
        except OSError as exc:
            state = f"unreadable {getattr(exc, 'errno', '')}"
        h.update(f"{name}|{state}\n".encode())
    # pip by its distribution's metadata, not importlib.util.find_spec("pip"): setuptools' distutils hack
    # answers that by switching this process to the stdlib's distutils (pypa/pip#8761)
    try:
        dist = importlib.metadata.distribution("pip")
        pip_file = f"{dist.version}|{dist.locate_file('')}"
    except (importlib.metadata.PackageNotFoundError, OSError, ValueError):
        pip_file = "no pip"
    env = sorted((k, v) for k, v in os.environ.items()
                 if k.startswith("PIP_") or k in (FIND_LINKS_ENV, "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "HOME"))
    h.update(repr((index_url or "", env, sys.executable, sys.prefix, pip_file)).encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:32]


def local_states(sources: Sources, name: str) -> tuple[tuple[str, str, str], ...]:
    """(kind, url, state) of every local source of `sources` (the absent ones included): a find-links
    folder by its stat (a file added or removed changes it), a file:// index by that of its root, of the
    project's folder and of its page. A remembered "not there" holds only while these stay as they were."""
    project = re.sub(r"[-_.]+", "-", name).lower()
    out = []
    for s in (*sources.sources, *sources.absent):
        local = _local_path(s.url)
        if local is None:
            continue
        paths = [local] if s.kind == "find-links" else [local, local / project, local / project / "index.html"]
        out.append((s.kind, s.url, " ".join(_stat_state(p) for p in paths)))
    return tuple(out)


def _stat_state(path: Path) -> str:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "absent"
    except OSError as exc:
        return f"unreadable-{exc.errno}"
    return f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def still_local_states(states: Sequence[Sequence[str]], name: str) -> bool:
    """Whether the local sources a remembered answer was given by (local_states) are as they were then."""
    again = local_states(Sources(tuple(IndexSource(url, kind, "") for kind, url, _ in states)), name)
    return len(again) == len(states) and all(a[2] == s[2] for a, s in zip(again, states, strict=True))


def _local_path(url: str) -> Path | None:
    if url.startswith("file:"):
        return Path(unquote(urlparse(url).path))
    if "://" not in url:
        return Path(url).expanduser()
    return None


class _Heard(logging.Handler):
    """unearth says why a page could not be read only in its log: kept here as the source's answer."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def _listening() -> Iterator[_Heard]:
    logger = logging.getLogger("unearth")
    heard = _Heard()
    saved = logger.propagate
    logger.addHandler(heard)
    logger.propagate = False  # nothing of unearth's reaches the user's terminal: it is part of the answer
    try:
        yield heard
    finally:
        logger.removeHandler(heard)
        logger.propagate = saved


def fetch(name: str, version: str, dest: Path, sources: Sources) -> Fetched | NotFetched:
    """The file of `name==version` (else of its newest post-release, same code line) from the first source
    that has one, downloaded into `dest` (a local file is used where it lies), its hash checked against
    the one the index published. Nothing is built, installed or imported."""
    absent: dict[str, None] = {}  # sources that answered "not here"
    failed: dict[str, str] = {}  # sources that could not answer, with why
    # One HTTP session for every source and both questions, and one finder per source: a session loads
    # the CA bundle into an SSL context (0.06-0.25 s of CPU each), which unearth does once per finder.
    with _Finders(sources) as finders:
        for spec in (f"{name}=={version}", f"{name}>={version}.post0,<{version}.post100000"):
            for source in sources.sources:
                got, answer, ok = _from_source(spec, source, dest, finders)
                if got is not None:
                    return got
                if ok:
                    absent[source.url] = None
                else:
                    failed.setdefault(source.url, answer)
    parts = []
    if absent:
        parts.append(f"{name}=={version} (nor a post-release) is on none of {', '.join(absent)}")
    if failed:
        parts.append("could not ask " + "; ".join(f"{url}: {why}" for url, why in failed.items()))
    if sources.skipped:
        parts.append(f"skipped {', '.join(sources.skipped)}")
    return NotFetched("; ".join(parts) or "no index configured", definitive=not failed)


class _Finders:
    """unearth's PackageFinder of each source, made on first use and sharing one session (with the
    credentials of every index, as unearth gives its own session), which is closed at the end."""

    def __init__(self, sources: Sources) -> None:
        self._indexes = [s.url for s in sources.sources if s.kind == "index"]
        self._session: object | None = None
        self._made: dict[IndexSource, object] = {}

    def __enter__(self) -> _Finders:
        return self

    def __exit__(self, *exc: object) -> None:
        close = getattr(self._session, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                close()

    def get(self, source: IndexSource) -> Any:  # an unearth.PackageFinder (unearth is imported late)
        import unearth

        finder = self._made.get(source)
        if finder is None:
            kind = {"index_urls": [source.url]} if source.kind == "index" else {"find_links": [source.url]}
            # ignore_compatibility: only the .py files are read, so a wheel for any platform serves
            finder = unearth.PackageFinder(self._shared(), **kind, ignore_compatibility=True)  # type: ignore[arg-type]
            self._made[source] = finder
        return finder

    def _shared(self) -> object | None:
        if self._session is None:
            try:
                from unearth.auth import MultiDomainBasicAuth
                from unearth.fetchers import PyPIClient
            except ImportError:  # another unearth layout: each finder makes its own session
                return None
            session = PyPIClient()
            session.auth = MultiDomainBasicAuth(index_urls=self._indexes)
            self._session = session
        return self._session


def _from_source(spec: str, source: IndexSource, dest: Path, finders: _Finders,
                 ) -> tuple[Fetched | None, str, bool]:
    """(the file, "", True) or (None, what the source answered, whether it answered at all)."""
    from unearth.preparer import download_link

    with _listening() as heard:
        try:
            finder = finders.get(source)
            best = next(iter(finder.find_matches(spec)), None)
        except Exception as exc:  # an unreachable index, a refused connection, a broken page: this source's answer
            return None, f"{type(exc).__name__}: {exc}", False
        failed = [h for h in heard.lines if "Client Error(404)" not in h]
        if best is None:
            return None, failed[-1] if failed else f"no file of {spec}", not failed
        try:
            path = download_link(finder.session, best.link, dest, hashes=best.link.hash_option)
        except Exception as exc:  # a hash mismatch or a broken download is this source's answer, not a crash
            return None, f"{best.link.filename}: {type(exc).__name__}: {exc}", False
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return Fetched(path, best.link.filename, str(best.version), digest, source.url,
                   verified=bool(best.link.hash_option)), "", True
