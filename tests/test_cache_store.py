# The result cache cannot lie: entries are checksummed data; a flipped byte, garbage, a pickle, a link
# to a FIFO or out of the cache is rejected and recomputed (same findings as --no-cache), never a crash.
from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import metax_audit
from metax_audit.cache.codec import CodecError
from metax_audit.cache.records import RECORDS, registry
from metax_audit.cache.store import MAGIC, SCHEMA, Key, Kind, rejected
from metax_audit.core.models import AuditReport

ROOT = Path(metax_audit.__file__).resolve().parents[1]


def _options(repo: Path, **kw: object) -> object:
    from metax_audit import demo as demo_mod
    from metax_audit.core.options import ReviewOptions

    options = ReviewOptions(mode="rev", rev="HEAD", repo=repo, upstream=str(demo_mod.upstream_root()),
                            extra_path=(demo_mod.stack_root(),))
    return replace(options, **kw)


def _review(repo: Path, **kw: object) -> AuditReport:
    from metax_audit.pipeline.review import review

    return review(_options(repo, **kw)).report  # type: ignore[arg-type]


def _findings(report: AuditReport) -> list[tuple[object, ...]]:
    return [(f.id, f.severity, f.message, f.location, f.evidence) for f in report.findings]


def _note(report: AuditReport) -> str:
    return next((s.note for s in report.stages if s.name == "cache"), "")


def _entries(cache: Path) -> Iterator[Path]:
    yield from sorted((cache / "results").glob("*/*.entry"))


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, list[tuple[object, ...]]]]:
    """The demo repo, a cache holding every kind of entry its review writes, and its --no-cache findings."""
    from metax_audit import demo as demo_mod

    base = tmp_path_factory.mktemp("warm")
    repo = demo_mod.build_demo_repo(base / "port")
    cache = base / "cache"
    mp = pytest.MonkeyPatch()
    mp.setenv("METAX_AUDIT_CACHE", str(cache))
    try:
        fresh = _findings(_review(repo, no_cache=True))
        assert _findings(_review(repo)) == fresh
        yield repo, cache, fresh
    finally:
        mp.undo()


def _copy(cache: Path, dest: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(cache, dest, symlinks=True)
    monkeypatch.setenv("METAX_AUDIT_CACHE", str(dest))
    return dest


# ---------------------------------------------------------------- the codec


def test_every_registered_name_is_a_record_and_tags_are_unique() -> None:
    reg = registry()  # raises on a name that is not a dataclass, enum or named tuple, or a tag used twice
    assert sum(len(v) for v in RECORDS.values()) >= 60 and reg is registry()


def test_the_demo_review_round_trips_through_the_codec(warm: tuple[Path, Path, list[tuple[object, ...]]],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    repo, cache, _ = warm
    report = _review(repo, no_cache=True)
    again = registry().loads(registry().dumps(report))
    assert again == report
    kinds = {p.parent.name for p in _entries(cache)}
    # the demo pins no kernel build: its index-miss entries are round-tripped by test_stack_pins
    assert kinds >= {k.value for k in Kind} - {"binding-file", "op-table-native", "op-table-python", "index-miss"}, \
        f"the demo writes no {sorted({k.value for k in Kind} - kinds)} entry"


def test_a_type_outside_the_registry_is_not_kept(audit_cache: Path) -> None:
    from metax_audit.cache import resultcache

    class Stranger:
        pass

    with pytest.raises(CodecError):
        registry().dumps([Stranger()])
    resultcache.store(Key(Kind("review"), "k"), (1, Stranger()))
    assert resultcache.load(Key(Kind("review"), "k")) is None and not list(audit_cache.glob("results/review/*"))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400) | st.text(max_size=200).map(str.encode))
def test_garbage_payloads_decode_or_fail_with_codec_error_only(data: bytes) -> None:
    with contextlib.suppress(CodecError):  # any other exception fails the test
        registry().loads(data)


@pytest.mark.parametrize("payload", [
    b"", b"[", b"{}", b'{"a":1,"b":2}', b'{"@os.system":["true"]}', b'{"@Location":[1]}', b'{"@Severity":"fatal"}',
    b'{"d":[[1]]}', b'{"f":[[1]]}', b'{"p":1}', b'{"b":"!!"}', b"[" * 100_000 + b"]" * 100_000,
    b"9" * 5000, b"1e99999", b'"\\ud800"', b"\xff\xfe",
], ids=lambda p: repr(p[:24]))
def test_forged_payloads_are_codec_errors(payload: bytes) -> None:
    try:
        value = registry().loads(payload)
    except CodecError:
        return
    assert isinstance(value, float | str | int)  # json's own scalars are data, nothing is built from them


# ---------------------------------------------------------------- the store


def _store() -> object:
    from metax_audit.cache.resultcache import STORE

    return STORE


def _entry(audit_cache: Path, kind: str = "review", value: object = ("root", [1, 2.5, None, "x"])) -> Path:
    from metax_audit.cache import resultcache

    resultcache.store(Key(Kind(kind), "entry"), value)
    return audit_cache / "results" / kind / "entry.entry"


def test_an_entry_is_a_header_with_a_checksum_and_json(audit_cache: Path) -> None:
    path = _entry(audit_cache)
    head, _, payload = path.read_bytes().partition(b"\n")
    fields = head.split(b" ")
    assert fields[:3] == [MAGIC, SCHEMA.encode(), b"review"] and int(fields[5]) == len(payload)
    assert json.loads(payload) == {"(": ["root", [1, 2.5, None, "x"]]}
    assert not list(path.parent.glob(".tmp-*"))  # written through a temp file renamed into place


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(offset=st.integers(min_value=0), flips=st.lists(st.integers(1, 255), min_size=1, max_size=3))
def test_any_flipped_bytes_reject_the_entry(audit_cache: Path, offset: int, flips: list[int]) -> None:
    from metax_audit.cache import resultcache

    path = _entry(audit_cache)
    data = bytearray(path.read_bytes())
    at = offset % len(data)
    for i, x in enumerate(flips):
        if at + i < len(data):
            data[at + i] ^= x
    path.write_bytes(bytes(data))
    before = rejected()
    assert resultcache.load(Key(Kind("review"), "entry")) is None
    assert rejected() == before + 1


@pytest.mark.parametrize("content", [b"", b"\n", b"garbage", b"metax-audit-cache v2 review x y 3\nabc",
                                     b"\x00" * 1000, b"\x80\x05\x95"],
                         ids=["empty", "newline", "garbage", "short-header", "zeros", "pickle-start"])
def test_garbage_truncated_and_empty_entries_are_rejected(audit_cache: Path, content: bytes) -> None:
    from metax_audit.cache import resultcache

    path = _entry(audit_cache)
    whole = path.read_bytes()
    for data in (content, whole[: len(whole) // 2], whole[:-1]):
        path.write_bytes(data)
        before = rejected()
        assert resultcache.load(Key(Kind("review"), "entry")) is None
        assert rejected() == before + 1


def test_an_entry_of_another_kind_or_version_is_rejected(audit_cache: Path) -> None:
    from metax_audit.cache import resultcache

    path = _entry(audit_cache)
    other = audit_cache / "results" / "compare" / "entry.entry"
    other.parent.mkdir(parents=True)
    shutil.copy(path, other)
    assert resultcache.load(Key(Kind("compare"), "entry")) is None  # the header names the kind it was written as
    head, _, payload = path.read_bytes().partition(b"\n")
    path.write_bytes(head.replace(b" " + SCHEMA.encode() + b" ", b" v1 ", 1) + b"\n" + payload)
    assert resultcache.load(Key(Kind("review"), "entry")) is None


def test_links_fifos_and_folders_in_place_of_an_entry_are_rejected_at_once(audit_cache: Path, tmp_path: Path) -> None:
    from metax_audit.cache import resultcache

    path = _entry(audit_cache)
    outside = tmp_path / "outside.entry"
    shutil.copy(path, outside)  # a valid entry, but out of the cache
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for make in (lambda: path.symlink_to(outside), lambda: path.symlink_to(fifo), lambda: os.mkfifo(path),
                 lambda: path.mkdir()):
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink()
        make()
        before = rejected()
        assert resultcache.load(Key(Kind("review"), "entry")) is None
        assert rejected() == before + 1
    # the kind folder itself a link out of the cache: nothing is read through it, nothing written
    path.rmdir()
    folder = path.parent
    shutil.rmtree(folder)
    (tmp_path / "elsewhere").mkdir()
    shutil.copy(outside, tmp_path / "elsewhere" / "entry.entry")
    folder.symlink_to(tmp_path / "elsewhere")
    assert resultcache.load(Key(Kind("review"), "entry")) is None
    resultcache.store(Key(Kind("review"), "other"), ("x",))
    assert not (tmp_path / "elsewhere" / "other.entry").exists()


def test_the_stack_facts_cache_reads_no_link_and_no_fifo(tmp_path: Path) -> None:
    from metax_audit.core.memo import read_kept_file
    from metax_audit.stages.introspect.cache import _read_cache

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    entry = tmp_path / "entry.json"
    entry.symlink_to(fifo)
    assert _read_cache(entry) is None  # returns at once: no open() that waits for a writer
    os.mkfifo(tmp_path / "plain-fifo")
    assert read_kept_file(tmp_path / "plain-fifo") is None
    (tmp_path / "deep.json").write_text("[" * 100_000)
    assert _read_cache(tmp_path / "deep.json") is None


def test_a_pickle_in_the_cache_is_never_loaded(audit_cache: Path, tmp_path: Path) -> None:
    from metax_audit.cache import resultcache

    marker = tmp_path / "ran"

    class Boom:
        def __reduce__(self) -> tuple[object, ...]:
            return (open, (str(marker), "w"))

    bomb = pickle.dumps(Boom())
    folder = audit_cache / "results" / "review"
    folder.mkdir(parents=True)
    (folder / "entry.pickle").write_bytes(bomb)  # where the pickle store kept it
    (folder / "entry.entry").write_bytes(bomb)
    assert resultcache.load(Key(Kind("review"), "entry")) is None
    assert not marker.exists()


def test_an_entry_of_the_wrong_shape_is_rejected(audit_cache: Path) -> None:
    from metax_audit.cache import resultcache

    for kind in Kind:  # a well-formed entry holding what no entry of its kind holds
        store = _store()
        key = Key(kind, "shape")
        path = audit_cache / "results" / kind.value / "shape.entry"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(store.encode(key, 12345))  # type: ignore[attr-defined]
        before = rejected()
        assert resultcache.load(key) is None and rejected() == before + 1, kind


def test_update_merges_under_a_lock(audit_cache: Path) -> None:
    store = _store()
    key = Key(Kind.CHECKS_FILE, "merged")
    assert store.update(key, lambda old: {**(old or {}), "a": 1})  # type: ignore[attr-defined]
    assert store.update(key, lambda old: {**(old or {}), "b": 2})  # type: ignore[attr-defined]
    assert store.get(key) == {"a": 1, "b": 2}  # type: ignore[attr-defined]


_WRITER = textwrap.dedent("""
    import os, sys
    from metax_audit.cache.store import Key, Kind, rejected
    from metax_audit.cache.resultcache import STORE
    me, rounds = int(sys.argv[1]), int(sys.argv[2])
    key, seen = Key(Kind.COMPARE, "shared"), set()
    for i in range(rounds):
        STORE.put(key, ("writer", me, i, "x" * (1000 * (1 + me + i % 7))))
        got = STORE.get(key)
        assert got is not None and got[0] == "writer" and len(got[3]) == 1000 * (1 + got[1] + got[2] % 7), got
        k2 = Key(Kind.CHECKS_FILE, "merged")
        STORE.update(k2, lambda old: {**(old or {}), (me, i): i})
    print(rejected())
""")


def test_parallel_writers_and_readers_never_see_part_of_an_entry(audit_cache: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(n), "60"], env=env, stdout=subprocess.PIPE, text=True)
             for n in range(4)]
    outs = [p.communicate(timeout=300)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0] and outs == ["0"] * 4
    merged = _store().get(Key(Kind.CHECKS_FILE, "merged"))  # type: ignore[attr-defined]
    assert set(merged) == {(me, i) for me in range(4) for i in range(60)}  # no writer's part was dropped


# ---------------------------------------------------------------- whole reviews


def test_a_flipped_byte_in_every_entry_gives_the_findings_of_no_cache(
        warm: tuple[Path, Path, list[tuple[object, ...]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo, cache, fresh = warm
    bad = _copy(cache, tmp_path / "cache", monkeypatch)
    entries = list(_entries(bad))
    for i, path in enumerate(entries):
        data = bytearray(path.read_bytes())
        data[(i * 7919) % len(data)] ^= 0x20
        path.write_bytes(bytes(data))
    report = _review(repo)
    assert _findings(report) == fresh
    assert "rejected" in _note(report) and not any(s.name == "result-cache" for s in report.stages)
    again = _review(repo)  # rewritten: served whole, nothing rejected
    assert _findings(again) == fresh and not _note(again)
    assert any(s.name == "result-cache" for s in again.stages)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pick=st.integers(min_value=0), offset=st.integers(min_value=0), flip=st.binary(min_size=3, max_size=3))
def test_three_byte_flips_in_any_entry_give_the_findings_of_no_cache(
        warm: tuple[Path, Path, list[tuple[object, ...]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        pick: int, offset: int, flip: bytes) -> None:
    repo, cache, fresh = warm
    bad = _copy(cache, tmp_path / "cache", monkeypatch)
    entries = [p for p in _entries(bad) if p.parent.name != "review"]
    path = entries[pick % len(entries)]
    data = bytearray(path.read_bytes())
    at = offset % len(data)
    data[at: at + 3] = bytes(a ^ (b or 1) for a, b in zip(data[at: at + 3], flip, strict=False))
    path.write_bytes(bytes(data))
    for whole in (bad / "results" / "review").glob("*.entry"):
        whole.unlink()  # so that the stages read the flipped entry
    report = _review(repo)
    assert _findings(report) == fresh


_REVIEW = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from metax_audit import demo
    from metax_audit.core.options import ReviewOptions
    from metax_audit.pipeline.review import review
    r = review(ReviewOptions(mode="rev", rev="HEAD", repo=Path(sys.argv[1]), upstream=str(demo.upstream_root()),
                             extra_path=(demo.stack_root(),))).report
    print(json.dumps({"findings": [[f.id, f.severity.value, f.message] for f in r.findings],
                      "stages": [[s.name, s.note] for s in r.stages]}))
""")


def _subreview(repo: Path, cache: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "METAX_AUDIT_CACHE": str(cache)}
    return subprocess.Popen([sys.executable, "-c", _REVIEW, str(repo)], env=env, stdout=subprocess.PIPE, text=True)


def test_entries_that_are_links_to_a_fifo_or_out_of_the_cache_never_hang_the_review(
        warm: tuple[Path, Path, list[tuple[object, ...]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo, cache, fresh = warm
    bad = _copy(cache, tmp_path / "cache", monkeypatch)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    outside = tmp_path / "outside"
    outside.mkdir()
    for i, path in enumerate(_entries(bad)):
        moved = outside / f"{i}.entry"
        shutil.move(path, moved)
        path.symlink_to(fifo if i % 2 else moved)
    proc = _subreview(repo, bad)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the review hung on a cache entry")
    assert proc.returncode == 0
    got = json.loads(out)
    assert [tuple(f) for f in got["findings"]] == [(f[0], f[1].value, f[2]) for f in fresh]  # type: ignore[attr-defined]
    assert any(name == "cache" and "rejected" in note for name, note in got["stages"])


def test_several_reviews_on_one_cache_at_once_give_identical_reports(
        warm: tuple[Path, Path, list[tuple[object, ...]]], tmp_path: Path) -> None:
    repo, _, fresh = warm
    cache = tmp_path / "shared-cache"
    procs = [_subreview(repo, cache) for _ in range(4)]
    outs = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4
    for got in outs:
        assert [tuple(f) for f in got["findings"]] == [(f[0], f[1].value, f[2]) for f in fresh]  # type: ignore[attr-defined]
        assert not any(name == "cache" for name, _ in got["stages"])  # no partial entry was ever read
