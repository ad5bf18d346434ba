# The vendor kernel stack a revision pinned (requirements files, Dockerfiles, setup.py) and what the
# review binds each pinned kernel package against: the installed build, a manifest, or the public base.
from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from metax_audit.core import fstree, inputs, subproc, tempdirs
from metax_audit.core.cachedir import cache_root
from metax_audit.core.config import AuditConfig
from metax_audit.core.findings import make_finding, rule
from metax_audit.core.memo import NO_MEMO, Kind, Memo
from metax_audit.core.models import Category, Finding, Location, Severity, StackFacts
from metax_audit.stages.upstream import COMPLETE_MARKER

rule("MXA160", Category.ENVIRONMENT, Severity.INFO, "kernel package bound against the public base of the pinned vendor build",
     "The revision pins a vendor build (a `+local` version) that is not what is installed here, so its calls and "
     "imports were bound statically against the public release it derives from (downloaded once, only its .py "
     "sources kept, never imported). A vendor change to that API is invisible: confirm with a manifest "
     "captured on the vendor stack (`metax-audit evidence --capture-stack`, then `review --stack`).")
rule("MXA161", Category.ENVIRONMENT, Severity.WARNING, "pinned kernel package could not be bound to the pinned version",
     "The revision pins a version that is neither installed here, nor in a stack manifest or kernel-sources, nor "
     "obtainable as a public base release from the configured package index. That stops the review (exit 2) "
     "unless allow-unbound accepts the package; accepted, the checks of calls into it ran against whatever is "
     "installed (or could not run), and every report's headline says how many calls went unchecked. Findings "
     "about it may not hold on the pinned stack: capture a manifest on the vendor stack (`metax-audit evidence "
     "--capture-stack`) and name it with --stack or `stack:` in the config.")

_PIN = re.compile(r"(?<![\w.\-/])([A-Za-z][A-Za-z0-9._-]*)\s*==\s*([0-9][A-Za-z0-9.+!_-]*)")
_PIN_FILE_SUFFIXES = (".txt", ".in", ".py", ".toml", ".cfg")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class StackPin:
    distribution: str  # as pinned: "flashinfer"
    version: str  # "0.2.6+metax3.8.0.7torch2.10"
    module: str  # the import package it provides: "flashinfer"
    location: Location  # the line that pins it

    @property
    def public_version(self) -> str:
        """The release a vendor build derives from: the version without its +local label."""
        return self.version.split("+", 1)[0]

    @property
    def vendor_build(self) -> bool:
        return "+" in self.version


@dataclass(frozen=True)
class StackBinding:
    pin: StackPin
    bound: str  # "installed" | "manifest" | "kernel-sources" | "public-base" | "unbound"
    installed: str | None = None  # the version installed in the target interpreter
    public: str | None = None  # "flashinfer-python==0.2.6"
    root: Path | None = None  # directory holding the stand-in's `module/` sources
    note: str = ""  # the evidence sentence
    why: str = ""  # unbound: why the public base could not be had
    kept_since: str = ""  # unbound: when the index's "not there" was asked, if it is kept (kept_miss), else ""

    @property
    def stand_in(self) -> str:
        """How a fact read from this binding is described in the evidence."""
        made = source_of(self.root) if self.root is not None else ""
        return (f"public base {self.public} of the pinned vendor build {self.pin.distribution}=={self.pin.version} "
                f"({self.pin.location}), read statically" + (f" from {made}" if made else ""))


def _pin_files(root: Path, entries: Iterable[str]) -> list[Path]:
    files: list[Path] = []
    for entry in entries:
        path = root / entry
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += sorted(p for p in fstree.files(path) if (
                p.suffix in _PIN_FILE_SUFFIXES or p.name.startswith("Dockerfile") or p.suffix == ".Dockerfile"
                or p.name.endswith(".Dockerfile")))
    return files


def read_pins(root: Path, config: AuditConfig) -> list[StackPin]:
    """Every `name==version` of a kernel package (config.kernel_modules) in the revision's pin files,
    first pin of each package in file order (requirements before Dockerfiles, as config lists them)."""
    modules = {canonical(m): m for m in config.kernel_modules}
    aliases = {canonical(vendor): canonical(public) for vendor, public in config.stack_public_names.items()}
    for vendor, public in aliases.items():
        if public in modules:
            modules.setdefault(vendor, modules[public])
    pins: dict[str, StackPin] = {}
    for path in _pin_files(root, config.stack_files):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        rel = path.relative_to(root).as_posix()
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.lstrip().startswith("#"):
                continue
            for m in _PIN.finditer(line.split(" #", 1)[0]):
                name = canonical(m.group(1))
                if name in modules and modules[name] not in pins:
                    pins[modules[name]] = StackPin(m.group(1), m.group(2).rstrip("."), modules[name], Location(rel, lineno, f"pin:{name}"))
    return [pins[m] for m in config.kernel_modules if m in pins]


def release_line(version: str) -> str:
    """The public release a version belongs to: no +local label, no .postN (post-releases change packaging,
    not the code line): 0.2.6.post1 and 0.2.6+metax3.8 are both 0.2.6."""
    return re.sub(r"[.-]?post\d*$", "", version.split("+", 1)[0])


def installed_versions(names: Sequence[str], python: str | None) -> dict[str, str]:
    """{canonical distribution name: version} installed in the target interpreter (read, never imported).
    The answer is kept in the stack cache under the interpreter's stack identity (its distributions'
    metadata by stat, introspect.stack_identity): the same stack answers the same without a subprocess."""
    import hashlib
    import json

    from metax_audit.stages.introspect import stack_cache_dir, stack_identity

    identity = stack_identity(python, ())
    kept = None
    if identity is not None:
        asked = hashlib.sha256(json.dumps([identity, sorted(names)]).encode()).hexdigest()[:32]
        kept = stack_cache_dir() / f"versions-{asked}.json"
        try:
            answer = json.loads(inputs.read_text(kept, follow_symlinks=False))
            if isinstance(answer, dict) and all(isinstance(v, str) for v in answer.values()):
                return answer
        except (OSError, ValueError):
            pass  # not asked before (or a damaged entry): ask the interpreter
    answer = _ask_versions(names, python)
    if kept is not None and answer is not None:
        with contextlib.suppress(OSError):  # a read-only cache only costs the next review its speed
            kept.parent.mkdir(parents=True, exist_ok=True)
            tmp = kept.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(answer), encoding="utf-8")
            os.replace(tmp, kept)
    return answer or {}


def _ask_versions(names: Sequence[str], python: str | None) -> dict[str, str] | None:
    """installed_versions from the interpreter itself; None when it could not answer."""
    code = ("import importlib.metadata as m, json, sys\n"
            "out = {}\n"
            "for n in sys.argv[1:]:\n"
            "    try: out[n] = m.version(n)\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(out))\n")
    # behind the fence, customize modules refused: an editable install's checkout may hold a sitecustomize
    done = subproc.run_python(python or sys.executable, ["-c", subproc.fenced_code(code), *names], timeout=60,
                              isolated=True, never_import=())
    if done.timed_out or done.returncode != 0:
        return None
    import json

    try:
        return {canonical(k): str(v) for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}
    except (ValueError, IndexError, AttributeError):
        return None


def bind(root: Path, config: AuditConfig, *, python: str | None, manifest: bool,
         cache_dir: Path | None = None, fetch: bool = True, kernel_roots: Sequence[Path] = (),
         index_url: str | None = None, memo: Memo = NO_MEMO) -> list[StackBinding]:
    """What each pinned kernel package is checked against. A manifest wins; then an installed build
    whose public release equals the pin's; then a kernel-sources root of config holding its package;
    else the pin's public base (public_base: found through the package index, never built). A package
    none of these binds is "unbound": the pipeline stops there unless allow-unbound accepts it."""
    pins = read_pins(root, config)
    if not pins:
        return []
    if manifest:
        return [StackBinding(p, "manifest", note="the stack manifest given with --stack stands for the pinned stack")
                for p in pins]
    names = sorted({canonical(p.distribution) for p in pins} | {canonical(_public_name(p, config)) for p in pins})
    installed = installed_versions(names, python)
    out: list[StackBinding] = []
    for pin in pins:
        have = installed.get(canonical(pin.distribution)) or installed.get(canonical(_public_name(pin, config)))
        if have is not None and (have == pin.version or release_line(have) == release_line(pin.version)):
            out.append(StackBinding(pin, "installed", installed=have, note=f"installed {have} matches the pin {pin.version}"))
            continue
        given = next((r for r in kernel_roots if (r / pin.module).is_dir()), None)
        if given is not None:
            out.append(StackBinding(pin, "kernel-sources", installed=have, root=given,
                                    note=f"{pin.distribution}=={pin.version} pinned at {pin.location}: read from "
                                         f"kernel-sources {given}"))
            continue
        public = f"{_public_name(pin, config)}=={pin.public_version}"
        entry, why = public_base(public, pin.module, cache_dir=cache_dir, fetch=fetch, index_url=index_url, memo=memo)
        if entry is not None:
            diff = f"installed {have} differs from the pin" if have else "not installed here"
            out.append(StackBinding(pin, "public-base", installed=have, public=public, root=entry,
                                    note=f"{pin.distribution}=={pin.version} pinned at {pin.location}: {diff}; "
                                         f"bound against the public base {public} (cache {entry})"))
        else:
            fallback = f"checked against the installed {have} instead" if have else "calls into it could not be checked"
            kept = kept_miss(public, pin.module, memo=memo, cache_dir=cache_dir, index_url=index_url) if fetch else None
            out.append(StackBinding(pin, "unbound", installed=have, public=public, why=why,
                                    kept_since=kept.asked if kept is not None and kept.why == why else "",
                                    note=f"{pin.distribution}=={pin.version} pinned at {pin.location}: the public base "
                                         f"{public} is unavailable ({why}); {fallback}"))
    return out


def unbound_line(b: StackBinding) -> str:
    """The one line that says why a pinned package could not be bound, and the ways out."""
    pin = b.pin
    have = f"installed here is {b.installed}, not the pinned release" if b.installed else "not installed here"
    return (f"{pin.module}: the pinned {pin.distribution}=={pin.version} ({pin.location}) cannot be bound: {have}, "
            f"and its public base {b.public}: {b.why}. Ways out: --stack FILE (a manifest captured on the vendor "
            f"stack with `metax-audit evidence --capture-stack FILE`), --python PATH (an interpreter with it "
            f"installed), kernel-sources in the config (a directory holding {pin.module}/), or "
            f"--allow-unbound {pin.module} to review without checking calls into it")


def _public_name(pin: StackPin, config: AuditConfig) -> str:
    by_canonical = {canonical(k): v for k, v in config.stack_public_names.items()}
    return by_canonical.get(canonical(pin.distribution), pin.distribution)


def binding_findings(bindings: Sequence[StackBinding]) -> list[Finding]:
    found = []
    for b in bindings:
        if b.bound == "public-base":
            found.append(make_finding("MXA160", b.pin.location, f"{b.pin.module}: bound against {b.public}, the public "
                                      f"base of the pinned {b.pin.distribution}=={b.pin.version}", [b.note]))
        elif b.bound == "unbound":
            # Checked against another installed version, findings about the package may be wrong: a warning.
            # Nothing installed, its calls were not checked at all: a coverage gap, shown but info.
            found.append(make_finding("MXA161", b.pin.location, f"{b.pin.module}: the pinned {b.pin.distribution}=="
                                      f"{b.pin.version} could not be bound", [b.note],
                                      severity=None if b.installed else Severity.INFO))
    return found


# ---------------------------------------------------------------- the public base in the cache


PUBLIC_BASE_DIR = "public-base"  # <cache>/public-base/NAME-VERSION/: a release's module sources, and what made them
_ANSWERS: dict[tuple[str, str], tuple[Path | None, str]] = {}  # this process's answers (a review and its baseline ask twice)
KEPT_MISS_S = 24 * 3600  # how long the index's definitive "not there" is believed (then it is asked again)


def index_answers() -> dict[tuple[str, str], tuple[Path | None, str]]:
    """This process's answers of the package index (bind in a forked child hands them back with its bindings)."""
    return dict(_ANSWERS)


def keep_index_answers(answers: dict[tuple[str, str], tuple[Path | None, str]]) -> None:
    """Take a child's answers as this process's own: the baseline review then asks nothing again."""
    _ANSWERS.update(answers)


def _now() -> float:
    return time.time()


@dataclass(frozen=True)
class KeptMiss:
    """The index's definitive answer that a public base is on none of the configured sources, as kept."""

    why: str  # the answer (pkgindex.NotFetched.why)
    asked: str  # when, ISO 8601 UTC


def _miss_parts(public: str, module: str, index_url: str | None) -> tuple[str, ...] | None:
    from metax_audit.stages.introspect import pkgindex

    identity = pkgindex.config_identity(index_url)
    return None if identity is None else (public, module, identity)


def kept_miss(public: str, module: str, *, memo: Memo, cache_dir: Path | None = None,
              index_url: str | None = None) -> KeptMiss | None:
    """The kept "not on the index" of `public` that still holds: kept under the same index configuration
    (pkgindex.config_identity), asked less than KEPT_MISS_S ago, every local source (find-links folder,
    file:// index) as it was then, and no public-base entry made since; else None (ask the index)."""
    from metax_audit.stages.introspect import pkgindex

    parts = _miss_parts(public, module, index_url) if memo.enabled else None  # --no-cache: nothing is kept
    value = memo.load(Kind.INDEX_MISS, *parts) if parts is not None else None
    if not (isinstance(value, dict) and isinstance(value.get("why"), str) and isinstance(value.get("asked"), (int, float))
            and isinstance(value.get("local"), list)):
        return None
    age = _now() - value["asked"]
    if not 0 <= age < KEPT_MISS_S:
        return None  # expired (or asked in the future: a clock set back): the index is asked again
    local = value["local"]
    if not all(isinstance(s, list) and len(s) == 3 and all(isinstance(x, str) for x in s) for s in local):
        return None
    if not pkgindex.still_local_states(local, public.split("==", 1)[0]):
        return None  # a find-links folder or a local index changed: what was not there may be now
    name, version = public.split("==", 1)
    entry = cache_root(cache_dir) / PUBLIC_BASE_DIR / f"{canonical(name)}-{version}"
    if (entry / COMPLETE_MARKER).is_file():
        return None
    import datetime as _dt

    asked = _dt.datetime.fromtimestamp(value["asked"], _dt.UTC).isoformat(timespec="seconds")
    return KeptMiss(value["why"], asked)


def public_base(public: str, module: str, *, cache_dir: Path | None = None, fetch: bool = True,
                index_url: str | None = None, memo: Memo = NO_MEMO) -> tuple[Path | None, str]:
    """The cache entry holding `module/`'s .py sources of the public release `public` (NAME==VERSION),
    made once from its wheel or sdist found through the package index pip is configured with (pkgindex:
    the simple API or a find-links folder, $METAX_AUDIT_FIND_LINKS first), its hash checked, only the
    Python sources unpacked: nothing is built, so no setup.py runs and neither torch nor a compiler is
    needed. When VERSION itself is not there, its newest post-release (same code line). (None, why) when
    none can be had. An answer of every source that it is not there is kept in `memo` (kept_miss: a day,
    under the index configuration); an index that could not be asked is never kept (it may answer next time)."""
    from metax_audit.stages.introspect import pkgindex

    name, version = public.split("==", 1)
    entry = cache_root(cache_dir) / PUBLIC_BASE_DIR / f"{canonical(name)}-{version}"
    if (entry / COMPLETE_MARKER).is_file() and (entry / module).is_dir():
        return entry, ""
    if not fetch:
        return None, "not in the cache and downloads are off"
    asked = (str(entry), index_url or "")
    if asked in _ANSWERS:
        return _ANSWERS[asked]
    kept = kept_miss(public, module, memo=memo, cache_dir=cache_dir, index_url=index_url)
    if kept is not None:
        _ANSWERS[asked] = (None, kept.why)
        return None, kept.why
    parts = _miss_parts(public, module, index_url) if memo.enabled else None  # before asking: what the answer is under
    try:
        work = tempdirs.make("stack", _ensure(entry.parent))
    except OSError as exc:
        return None, f"cache not writable: {exc}"
    try:
        sources = pkgindex.configured_sources(index_url=index_url)
        local = pkgindex.local_states(sources, name)  # before asking too: a file added meanwhile is asked next time
        got = pkgindex.fetch(name, version, work, sources)
        if isinstance(got, pkgindex.NotFetched):
            _ANSWERS[asked] = (None, got.why)
            if got.definitive and parts is not None:
                memo.store(Kind.INDEX_MISS, {"why": got.why, "asked": _now(), "local": [list(s) for s in local]}, *parts)
            return None, got.why
        partial = work / "extract"
        if not extract_sources(got.path, module, partial):
            why = f"{got.filename} (from {got.source}) holds no {module}/ package"
            _ANSWERS[asked] = (None, why)
            return None, why
        fstree.rmtree(entry, ignore_errors=True)
        partial.rename(entry)
        instead = f" (instead of {version}, not on the index)" if got.version != version else ""
        checked = "sha256 checked against the index" if got.verified else "sha256"
        (entry / COMPLETE_MARKER).write_text(
            f"{public} from {got.filename}{instead}, {checked} {got.sha256}, {got.source}\n", encoding="utf-8")
        return entry, ""
    finally:
        fstree.rmtree(work, ignore_errors=True)


def source_of(entry: Path) -> str:
    """What a public-base cache entry was made from ("flashinfer_python-0.2.6.tar.gz, sha256 ...")."""
    try:
        text = inputs.read_text(entry / COMPLETE_MARKER, follow_symlinks=False).strip()
    except OSError:
        return ""
    return text.split(" from ", 1)[1] if " from " in text else ""


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def extract_sources(archive: Path, module: str, target: Path) -> int:
    """Copy the .py files of the shallowest `module/` package in a wheel or sdist to target/module/."""
    members = _members(archive)
    tops = sorted((p for p in members if PurePosixPath(p).name == "__init__.py" and PurePosixPath(p).parent.name == module),
                  key=lambda p: p.count("/"))
    if not tops:
        return 0
    prefix = str(PurePosixPath(tops[0]).parent) + "/"
    count = 0
    for name, data in members.items():
        if not (name.startswith(prefix) and name.endswith(".py")):
            continue
        rel = PurePosixPath(module) / name[len(prefix):]
        if ".." in rel.parts:
            continue  # a hostile archive path
        out = target / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
        count += 1
    return count


def _members(archive: Path) -> dict[str, bytes]:
    """{member path: bytes} of the Python files (and __init__ markers) of a wheel/zip or a tar sdist."""
    if archive.suffix in {".whl", ".zip"}:
        with zipfile.ZipFile(archive) as zf:
            return {i.filename: zf.read(i) for i in zf.infolist() if i.filename.endswith(".py") and not i.is_dir()}
    out: dict[str, bytes] = {}
    with tarfile.open(archive) as tf:
        for m in tf.getmembers():
            if m.isfile() and m.name.endswith(".py"):
                out[m.name] = (tf.extractfile(m) or io.BytesIO()).read()
    return out


def mark_stand_ins(facts: StackFacts, stand_ins: Sequence[StackBinding], extended: Sequence[str] = ()) -> StackFacts:
    """Say on each fact read from a public-base stand-in what it stands for (the evidence names it), and
    whether config's vendor-extends says the vendor build adds to that public API (then what the public
    base lacks is a warning: the vendor build may take it; else an error: the build derives from that release)."""
    by_module = {b.pin.module: b for b in stand_ins}
    if not by_module:
        return facts
    wider = {canonical(m) for m in extended}
    marked = {t: replace(f, stand_in=by_module[t.split(".")[0]].stand_in,
                         stand_in_extended=canonical(t.split(".")[0]) in wider or canonical(by_module[t.split(".")[0]].pin.distribution) in wider)
              if t.split(".")[0] in by_module else f
              for t, f in facts.facts.items()}
    return replace(facts, facts=marked)
