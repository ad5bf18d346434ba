# The stack a revision pinned: pins read from requirements/Dockerfiles/setup.py, and each kernel
# package bound to the installed build, a manifest, or the public base from the cache (never downloaded here).
from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from conftest import write_tree

from metax_audit.core import subproc
from metax_audit.core.config import AuditConfig
from metax_audit.core.models import Severity
from metax_audit.stages.introspect import pkgindex, stack_pins
from metax_audit.stages.introspect.stack_pins import bind, binding_findings, extract_sources, public_base, read_pins
from metax_audit.stages.upstream import COMPLETE_MARKER

PINS = {
    "requirements/common.txt": "numpy\n# flashinfer==0.0.1 (a comment)\n",
    "requirements/vendor.txt": "--extra-index-url https://x\nflashinfer==0.2.6+metax3.8.0.7torch2.10\nflash_attn==2.6.3+metax3.8.0.7\n",
    "docker/port.Dockerfile": "RUN pip install flash_mla==1.0.1 flashinfer==9.9.9\n",
    "setup.py": "install_requires=['torch==2.10.0']\n",
}
CFG = AuditConfig(port_package="port")


def _sdist(path: Path, top: str, module: str, files: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for rel, text in {"setup.py": "", **{f"{module}/{k}": v for k, v in files.items()}}.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def _cache_entry(cache: Path, public: str, module: str) -> Path:
    entry = cache / stack_pins.PUBLIC_BASE_DIR / public.replace("==", "-")
    write_tree(entry, {f"{module}/__init__.py": "def run(q, k, v, *, scale=1.0): ...\n"})
    (entry / COMPLETE_MARKER).write_text(public)
    return entry


def test_read_pins_first_pin_per_package_in_file_order(tmp_path: Path) -> None:
    write_tree(tmp_path, PINS)
    pins = read_pins(tmp_path, CFG)
    assert [(p.module, p.version, str(p.location)) for p in pins] == [
        ("flashinfer", "0.2.6+metax3.8.0.7torch2.10", "requirements/vendor.txt:2"),
        ("flash_attn", "2.6.3+metax3.8.0.7", "requirements/vendor.txt:3"),
        ("flash_mla", "1.0.1", "docker/port.Dockerfile:1"),
    ]
    assert pins[0].public_version == "0.2.6" and pins[0].vendor_build and not pins[2].vendor_build


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    versions: dict[str, str] = {}
    monkeypatch.setattr(stack_pins, "installed_versions", lambda names, python: dict(versions))

    def no_pip(*args: object, **kwargs: object) -> None:
        raise AssertionError("tests never download")

    monkeypatch.setattr(subproc, "run", no_pip)
    monkeypatch.setattr(pkgindex, "configured_sources", lambda **kw: pkgindex.Sources(()))  # no index at all
    return versions


@pytest.fixture
def links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A find-links folder, and a pip configured with no index (nothing leaves this machine)."""
    folder = tmp_path / "links"
    folder.mkdir()
    monkeypatch.setattr(pkgindex, "pip_settings", lambda python=None: ({":env:.no-index": "1", ":env:.find-links": str(folder)}, ""))
    monkeypatch.delenv(pkgindex.FIND_LINKS_ENV, raising=False)
    stack_pins._ANSWERS.clear()
    return folder


@pytest.mark.parametrize(("installed_version", "cached", "bound", "rule"), [
    ("0.2.6+metax3.8.0.7torch2.10", True, "installed", None),  # the vendor build itself
    ("0.2.6", True, "installed", None),  # its public base: same API as far as we can tell
    ("0.2.6.post1", True, "installed", None),  # a post-release: the same code line as the pin
    ("0.2.5", True, "public-base", "MXA160"),  # installed differs from the pin: bind the pin's base
    ("0.3.0+metax9", True, "public-base", "MXA160"),  # another vendor build, of another release
    (None, True, "public-base", "MXA160"),  # not installed at all
    ("0.2.5", False, "unbound", "MXA161"),  # no stand-in obtainable: say so, keep the installed one
])
def test_binding_table(tmp_path: Path, installed: dict[str, str], installed_version: str | None, cached: bool,
                       bound: str, rule: str | None) -> None:
    write_tree(tmp_path / "repo", {"requirements/vendor.txt": "flashinfer==0.2.6+metax3.8.0.7torch2.10\n"})
    if installed_version:
        installed["flashinfer"] = installed_version
    if cached:
        _cache_entry(tmp_path / "cache", "flashinfer-python==0.2.6", "flashinfer")
    [b] = bind(tmp_path / "repo", CFG, python=None, manifest=False, cache_dir=tmp_path / "cache")
    assert b.bound == bound
    found = binding_findings([b])
    assert [f.rule for f in found] == ([rule] if rule else [])
    if bound == "public-base":
        assert b.stand_in.startswith("public base flashinfer-python==0.2.6 of the pinned vendor build flashinfer==0.2.6+metax")
        assert (b.root / "flashinfer" / "__init__.py").is_file()
    if rule == "MXA161":
        assert found[0].severity is Severity.WARNING and "no index configured" in found[0].evidence[0]
        assert "--allow-unbound flashinfer" in stack_pins.unbound_line(b) and "--stack FILE" in stack_pins.unbound_line(b)


def test_manifest_wins_and_no_pins_bind_nothing(tmp_path: Path, installed: dict[str, str]) -> None:
    write_tree(tmp_path, PINS)
    assert {b.bound for b in bind(tmp_path, CFG, python=None, manifest=True)} == {"manifest"}
    assert bind(tmp_path / "requirements", CFG, python=None, manifest=False) == []


def test_public_base_from_a_find_links_sdist_never_runs_its_setup(tmp_path: Path, links: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # the sdist's setup.py imports torch (as flashinfer's and flash-attn's do): nothing may run it
    sdist = _sdist(links / "kern-1.0.tar.gz", "kern-1.0", "kern",
                   {"__init__.py": "from .api import run\n", "api.py": "def run(x): ...\n", "data.bin": "x"})
    monkeypatch.setattr(subproc, "run", lambda *a, **k: pytest.fail("finding a public base runs no process"))
    entry, why = public_base("kern==1.0", "kern", cache_dir=tmp_path / "cache")
    assert why == "" and entry is not None
    assert sorted(p.relative_to(entry).as_posix() for p in entry.rglob("*.py")) == ["kern/__init__.py", "kern/api.py"]
    sdist.unlink()  # cached: the next review needs no index
    again, _ = public_base("kern==1.0", "kern", cache_dir=tmp_path / "cache")
    assert again == entry and "sha256" in stack_pins.source_of(entry)


def test_public_base_from_a_simple_index_checks_the_published_hash(tmp_path: Path, links: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # a PEP 503 index as a folder (file://): the file's sha256 in its link is checked before unpacking
    import hashlib

    index = tmp_path / "simple"
    files = tmp_path / "files"
    files.mkdir()
    sdist = _sdist(files / "kern-1.0.tar.gz", "kern-1.0", "kern", {"__init__.py": "A = 1\n"})
    good = hashlib.sha256(sdist.read_bytes()).hexdigest()

    def serve(digest: str) -> None:
        write_tree(index, {"kern/index.html": f'<a href="{sdist.as_uri()}#sha256={digest}">kern-1.0.tar.gz</a>\n'})
    monkeypatch.setattr(pkgindex, "pip_settings", lambda python=None: ({":env:.index-url": index.as_uri()}, ""))
    serve("0" * 64)
    entry, why = public_base("kern==1.0", "kern", cache_dir=tmp_path / "cache")
    assert entry is None and "HashMismatch" in why and index.as_uri() in why
    stack_pins._ANSWERS.clear()
    serve(good)
    entry, why = public_base("kern==1.0", "kern", cache_dir=tmp_path / "cache")
    assert entry is not None and f"sha256 checked against the index {good}" in stack_pins.source_of(entry)


def test_a_missing_release_names_every_source_asked_and_is_not_kept(tmp_path: Path, links: Path) -> None:
    missing = tmp_path / "no-such-index"
    entry, why = public_base("kern==1.0", "kern", cache_dir=tmp_path / "cache")
    assert entry is None and why == f"kern==1.0 (nor a post-release) is on none of {links}"
    assert not (tmp_path / "cache" / stack_pins.PUBLIC_BASE_DIR / "kern-1.0").exists()
    sources = pkgindex.configured_sources(settings={":env:.index-url": missing.as_uri(), ":env:.find-links": str(links)})
    assert [s.url for s in sources.sources] == [str(links)] and sources.skipped == (f"{missing.as_uri()} (PIP_INDEX_URL) does not exist",)


def test_an_unreachable_index_is_said_with_its_error(tmp_path: Path, links: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on: the connection is refused at once
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setattr(pkgindex, "pip_settings", lambda python=None: ({":env:.index-url": f"http://127.0.0.1:{port}/simple/"}, ""))
    entry, why = public_base("kern==1.0", "kern", cache_dir=tmp_path / "cache")
    assert entry is None and why.startswith(f"could not ask http://127.0.0.1:{port}/simple/: ConnectError")


def test_extract_skips_hostile_and_non_python(tmp_path: Path) -> None:
    sdist = _sdist(tmp_path / "k.tar.gz", "k-1", "kern", {"__init__.py": "", "a.txt": "x", "sub/b.py": "y = 1\n"})
    assert extract_sources(sdist, "kern", tmp_path / "out") == 2
    assert extract_sources(sdist, "other", tmp_path / "out2") == 0


def test_local_archive_post_release_stands_in(tmp_path: Path, links: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the exact release is absent from the local archives; its post-release is the same code line
    mine = tmp_path / "mine"
    mine.mkdir()
    _sdist(mine / "kern_python-1.0.post2.tar.gz", "kern_python-1.0.post2", "kern", {"__init__.py": "A = 1\n"})
    _sdist(mine / "kern_python-1.1.tar.gz", "kern_python-1.1", "kern", {"__init__.py": "A = 2\n"})
    monkeypatch.setenv(pkgindex.FIND_LINKS_ENV, str(mine))
    monkeypatch.setattr(subproc, "run", lambda *a, **k: pytest.fail("a local archive needs no pip"))
    entry, _ = public_base("kern-python==1.0", "kern", cache_dir=tmp_path / "cache")
    assert entry is not None and (entry / "kern/__init__.py").read_text() == "A = 1\n"
    assert stack_pins.source_of(entry).startswith("kern_python-1.0.post2.tar.gz (instead of 1.0")


@pytest.mark.parametrize(("stand_in", "extended", "rule_id", "severity"), [
    (None, False, "MXA101", Severity.ERROR),  # the installed kernel
    ("public base kern==1.0 of ...", False, "MXA101", Severity.ERROR),  # the vendor build derives from that release
    # vendor-extends: its build adds to the public API, so the call is unchecked (counted in the headline), not a break
    ("public base kern==1.0 of ...", True, "MXA113", Severity.INFO),
])
def test_unknown_keyword_against_a_public_base_stand_in(tmp_path: Path, stand_in: str | None, extended: bool,
                                                        rule_id: str, severity: Severity) -> None:
    # a vendor build known to extend its public base (config vendor-extends) may take what the base lacks
    from metax_audit.core.models import CallableFact, CallArg, CallSite, Location, ParamFact, StackFacts, TraceResult
    from metax_audit.stages.checks.signatures import check_signatures

    target = "kern.run"
    fact = CallableFact(target, "ok", "static", signature="(q)", params=(ParamFact("q", "POSITIONAL_OR_KEYWORD"),),
                        stand_in=stand_in, stand_in_extended=extended)
    call = CallSite(Location("port/a.py", 3), "f", "run", target, "external",
                    (CallArg(None, 0, "q"), CallArg("s_aux", None, "sinks")))
    [finding] = check_signatures(tmp_path, TraceResult((), (), (call,)), StackFacts("py", "", "", {target: fact}))
    assert (finding.rule, finding.severity) == (rule_id, severity)
    assert any("bound against the public base" in e for e in finding.evidence) == bool(stand_in)
    assert any("--capture-stack" in e for e in finding.evidence) == extended  # the way out is said


@pytest.mark.parametrize(("stand_in", "expected"), [(None, 3), ("public base kern==1.0 of ...", 1)])
def test_one_keyword_missing_from_a_stand_in_at_several_calls_is_one_root_cause(
        tmp_path: Path, stand_in: str | None, expected: int) -> None:
    # against the real kernel each call that cannot bind is its own error; against the public base of a
    # vendor build the calls share one question (does the vendor build take the keyword?): one finding
    from metax_audit.core.models import CallableFact, CallArg, CallSite, Location, ParamFact, StackFacts, TraceResult
    from metax_audit.stages.checks.signatures import check_signatures

    target = "kern.run"
    fact = CallableFact(target, "ok", "static", signature="(q)", params=(ParamFact("q", "POSITIONAL_OR_KEYWORD"),),
                        stand_in=stand_in)
    calls = tuple(CallSite(Location(path, line), "f", "run", target, "external",
                           (CallArg(None, 0, "q"), CallArg("s_aux", None, "sinks")))
                  for path, line in (("port/a.py", 3), ("port/a.py", 9), ("port/b.py", 4)))
    findings = list(check_signatures(tmp_path, TraceResult((), (), calls), StackFacts("py", "", "", {target: fact})))
    assert [f.rule for f in findings] == ["MXA101"] * expected
    if stand_in:
        [one] = findings
        assert str(one.location) == "port/a.py:3" and one.message.startswith("3 calls pass s_aux=, which the public base of kern")
        assert [e for e in one.evidence if e.startswith("also at ")][-1].startswith("also at port/b.py:4:")


@pytest.mark.parametrize(("installed", "severity"), [("0.2.6", Severity.WARNING), (None, Severity.INFO)])
def test_an_unbound_pin_warns_only_when_another_version_was_checked_instead(installed: str | None,
                                                                           severity: Severity) -> None:
    # checked against another installed version, findings may not hold: warning; nothing installed,
    # nothing was checked: a coverage gap, info
    from metax_audit.core.models import Location
    from metax_audit.stages.introspect.stack_pins import StackBinding, StackPin

    pin = StackPin("kern", "1.0+vendor", "kern", Location("requirements/vendor.txt", 3))
    [finding] = binding_findings([StackBinding(pin, "unbound", installed=installed, note="no public base")])
    assert (finding.rule, finding.severity) == ("MXA161", severity)


def test_installed_versions_are_asked_once_per_stack_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter is asked once; the same stack (identity) answers from the stack cache, with
    the same answer; another identity (a distribution installed or upgraded) asks again."""
    import sys

    from metax_audit.stages import introspect

    asked: list[list[str]] = []
    real_ask = stack_pins._ask_versions

    def ask(names: list[str], python: str | None) -> dict[str, str] | None:
        asked.append(list(names))
        return real_ask(names, python)

    monkeypatch.setattr(stack_pins, "_ask_versions", ask)
    identity = ["stack-a"]
    monkeypatch.setattr(introspect, "stack_identity", lambda python, extra=(): identity[0])
    first = stack_pins.installed_versions(["pytest", "no-such-dist"], sys.executable)
    assert first == {"pytest": pytest.__version__} and len(asked) == 1
    assert stack_pins.installed_versions(["pytest", "no-such-dist"], sys.executable) == first and len(asked) == 1
    identity[0] = "stack-b"
    assert stack_pins.installed_versions(["pytest", "no-such-dist"], sys.executable) == first and len(asked) == 2
    assert stack_pins.installed_versions(["no-such-dist"], sys.executable) == {} and len(asked) == 3


def test_a_kernel_sources_directory_binds_a_pin_without_any_index(tmp_path: Path, installed: dict[str, str]) -> None:
    write_tree(tmp_path / "repo", {"requirements/vendor.txt": "flash_mla==1.0.1+vendor\n"})
    write_tree(tmp_path / "src", {"flash_mla/__init__.py": "def run(q): ...\n"})
    [b] = bind(tmp_path / "repo", CFG, python=None, manifest=False, cache_dir=tmp_path / "cache",
               kernel_roots=(tmp_path / "elsewhere", tmp_path / "src"))
    assert (b.bound, b.root) == ("kernel-sources", tmp_path / "src") and binding_findings([b]) == []
    [b] = bind(tmp_path / "repo", CFG, python=None, manifest=False, cache_dir=tmp_path / "cache")
    assert b.bound == "unbound"


def test_config_that_widens_vendor_extends_or_accepts_unbound_says_so(tmp_path: Path) -> None:
    from dataclasses import replace

    from metax_audit.core.config import departures

    config = replace(CFG, vendor_extends=("flash_attn", "flashinfer"), allow_unbound=("flash_mla",))
    said = departures(config, tmp_path)
    assert "vendor-extends adds flashinfer (calls passing keywords their public base lacks go unchecked, not errors)" in said
    assert "allow-unbound accepts flash_mla unbound (calls into it go unchecked)" in said


# ---------------------------------------------------------------- the index's "not there", kept a day


@pytest.fixture
def memo() -> object:
    from metax_audit.cache.memo import review_memo

    return review_memo(True)  # the result cache of this test's private METAX_AUDIT_CACHE (conftest)


def _asks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every question put to the index from now on (each still answered as before)."""
    asked: list[str] = []
    real = pkgindex.fetch

    def fetch(name: str, version: str, dest: Path, sources: pkgindex.Sources) -> object:
        asked.append(f"{name}=={version}")
        return real(name, version, dest, sources)

    monkeypatch.setattr(pkgindex, "fetch", fetch)
    stack_pins._ANSWERS.clear()  # a new review (process)
    return asked


def test_a_definitive_miss_is_kept_a_day_then_asked_again(tmp_path: Path, links: Path, memo: object,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    entry, why = public_base("kern==1.0", "kern", cache_dir=cache, memo=memo)  # type: ignore[arg-type]
    assert entry is None and why == f"kern==1.0 (nor a post-release) is on none of {links}"
    asked = _asks(monkeypatch)
    assert public_base("kern==1.0", "kern", cache_dir=cache, memo=memo) == (None, why)  # type: ignore[arg-type]
    assert asked == [] and stack_pins.kept_miss("kern==1.0", "kern", memo=memo, cache_dir=cache) is not None  # type: ignore[arg-type]
    # --no-cache (no memo) asks again; so does another release
    stack_pins._ANSWERS.clear()
    assert public_base("kern==1.0", "kern", cache_dir=cache) == (None, why) and asked == ["kern==1.0"]
    stack_pins._ANSWERS.clear()
    assert public_base("kern==1.1", "kern", cache_dir=cache, memo=memo)[0] is None and asked[-1] == "kern==1.1"  # type: ignore[arg-type]
    # a day later the index is asked again, and what appeared there meanwhile is bound
    stack_pins._ANSWERS.clear()
    later = stack_pins._now() + stack_pins.KEPT_MISS_S
    monkeypatch.setattr(stack_pins, "_now", lambda: later)
    assert stack_pins.kept_miss("kern==1.0", "kern", memo=memo, cache_dir=cache) is None  # type: ignore[arg-type]
    monkeypatch.setattr(pkgindex, "pip_settings", lambda python=None: ({":env:.no-index": "1", ":env:.find-links": str(links)}, ""))
    asked.clear()
    assert public_base("kern==1.0", "kern", cache_dir=cache, memo=memo) == (None, why) and asked == ["kern==1.0"]  # type: ignore[arg-type]
    # a clock set back (the answer from the future) is not believed either
    monkeypatch.setattr(stack_pins, "_now", lambda: later - 2 * stack_pins.KEPT_MISS_S)
    assert stack_pins.kept_miss("kern==1.0", "kern", memo=memo, cache_dir=cache) is None  # type: ignore[arg-type]


def test_a_kept_miss_holds_only_while_the_local_sources_and_the_index_config_stay(tmp_path: Path, links: Path, memo: object,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    assert public_base("kern==1.0", "kern", cache_dir=cache, memo=memo)[0] is None  # type: ignore[arg-type]
    assert stack_pins.kept_miss("kern==1.0", "kern", memo=memo, cache_dir=cache) is not None  # type: ignore[arg-type]
    # another index configuration (here $METAX_AUDIT_FIND_LINKS) is another question
    monkeypatch.setenv(pkgindex.FIND_LINKS_ENV, str(tmp_path / "no-such-folder"))
    assert stack_pins.kept_miss("kern==1.0", "kern", memo=memo, cache_dir=cache) is None  # type: ignore[arg-type]
    monkeypatch.delenv(pkgindex.FIND_LINKS_ENV)
    assert stack_pins.kept_miss("kern==1.0", "kern", memo=memo, cache_dir=cache) is not None  # type: ignore[arg-type]
    # the release dropped into the find-links folder is found at once, kept answer or not
    _sdist(links / "kern-1.0.tar.gz", "kern-1.0", "kern", {"__init__.py": "A = 1\n"})
    assert stack_pins.kept_miss("kern==1.0", "kern", memo=memo, cache_dir=cache) is None  # type: ignore[arg-type]
    asked = _asks(monkeypatch)
    entry, why = public_base("kern==1.0", "kern", cache_dir=cache, memo=memo)  # type: ignore[arg-type]
    assert entry is not None and why == "" and asked == ["kern==1.0"]


def test_an_index_that_could_not_be_asked_is_never_kept(tmp_path: Path, links: Path, memo: object,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on: the connection is refused at once
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setattr(pkgindex, "pip_settings", lambda python=None: ({":env:.index-url": f"http://127.0.0.1:{port}/simple/",
                                                                          ":env:.find-links": str(links)}, ""))
    entry, why = public_base("kern==1.0", "kern", cache_dir=tmp_path / "cache", memo=memo)  # type: ignore[arg-type]
    assert entry is None and "could not ask" in why
    assert stack_pins.kept_miss("kern==1.0", "kern", memo=memo, cache_dir=tmp_path / "cache") is None  # type: ignore[arg-type]
    asked = _asks(monkeypatch)
    assert public_base("kern==1.0", "kern", cache_dir=tmp_path / "cache", memo=memo)[0] is None and asked == ["kern==1.0"]  # type: ignore[arg-type]
def test_vendor_extends_makes_an_absent_keyword_an_unchecked_call_counted_in_every_headline(tmp_path: Path) -> None:
    # a keyword only the public base of a vendor-extends package lacks is not a proven break: one info finding per
    # keyword listing its calls, counted as unchecked in the headline with the way out; a positional or a
    # required-argument break is an error even there (an extension adds parameters, it does not move them)
    from dataclasses import replace

    import report_factory as rf

    from metax_audit.core.models import CallableFact, CallArg, CallSite, Location, ParamFact, StackFacts, TraceResult
    from metax_audit.report.first_screen import first_screen
    from metax_audit.report.junit import to_junit_xml
    from metax_audit.stages.checks.signatures import check_signatures
    from metax_audit.stages.inventory import summary_line, unchecked_headline

    target = "kern.run"
    fact = CallableFact(target, "ok", "static", signature="(q, k)",
                        params=(ParamFact("q", "POSITIONAL_OR_KEYWORD"), ParamFact("k", "POSITIONAL_OR_KEYWORD")),
                        stand_in="public base kern==1.0 of kern==1.0+vendor", stand_in_extended=True)

    def call(line: int, *args: CallArg) -> CallSite:
        return CallSite(Location("port/a.py", line), "f", "run", target, "external", args)

    q, k, aux = CallArg(None, 0, "q"), CallArg(None, 1, "k"), CallArg("s_aux", None, "sinks")
    calls = (call(3, q, k, aux), call(9, q, k, aux), call(12, q, k, CallArg(None, 2, "x")), call(15, q))
    findings = list(check_signatures(tmp_path, TraceResult((), (), calls), StackFacts("py", "", "", {target: fact})))
    by_rule = {f.rule: f for f in findings}
    assert sorted(by_rule) == ["MXA102", "MXA103", "MXA113"]
    unchecked = by_rule["MXA113"]
    assert unchecked.severity == Severity.INFO and [(s.path, s.line) for s in unchecked.sites] == [("port/a.py", 3), ("port/a.py", 9)]
    assert by_rule["MXA102"].severity == by_rule["MXA103"].severity == Severity.ERROR
    report = rf.make_report(findings=[unchecked])
    headline = unchecked_headline(report)
    assert headline.startswith("INCOMPLETE: 2 calls unchecked, passing s_aux= into kern (2)") and "--capture-stack" in headline
    assert first_screen(report).verdict.startswith(headline) and headline in summary_line(report)
    assert "bind s_aux= into kern" in to_junit_xml(report)
    waived = rf.make_report(findings=[replace(unchecked, waived=True)])
    assert unchecked_headline(waived) == ""  # a waiver accepts it on purpose: no longer counted
