"""The package-index lookups keep what costs CPU and cannot change between reviews: pip's own reading of
its configuration (kept under the digest of its inputs) and one HTTP session for every source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from metax_audit.stages.introspect import pkgindex


@pytest.fixture
def counted_pip(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []

    def fake(python: str | None = None) -> tuple[dict[str, str], str]:
        calls.append(1)
        return {":env:.find-links": "/nowhere", "global.index-url": "https://example.invalid/simple"}, ""

    monkeypatch.setattr(pkgindex, "pip_settings", fake)
    return calls


def test_pip_settings_are_asked_once_per_configuration(counted_pip: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    first = pkgindex.kept_pip_settings()
    again = pkgindex.kept_pip_settings()
    assert first == again == {":env:.find-links": "/nowhere", "global.index-url": "https://example.invalid/simple"}
    assert len(counted_pip) == 1  # the second answer is the kept one
    monkeypatch.setenv("PIP_INDEX_URL", "https://other.invalid/simple")  # another input of pip's answer
    pkgindex.kept_pip_settings()
    assert len(counted_pip) == 2


def test_a_config_file_edit_asks_pip_again(counted_pip: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = https://a.invalid/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    pkgindex.kept_pip_settings()
    pkgindex.kept_pip_settings()
    assert len(counted_pip) == 1
    conf.write_text("[global]\nindex-url = https://b.invalid/simple\n")
    pkgindex.kept_pip_settings()
    assert len(counted_pip) == 2


def test_an_answer_pip_could_not_give_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def failing(python: str | None = None) -> tuple[dict[str, str], str]:
        calls.append(1)
        return {}, "pip config list failed: PIP_* variables read directly"

    monkeypatch.setattr(pkgindex, "pip_settings", failing)
    pkgindex.kept_pip_settings()
    pkgindex.kept_pip_settings()
    assert len(calls) == 2


def test_a_damaged_entry_is_a_miss(counted_pip: list[int]) -> None:
    from metax_audit.stages.introspect.cache import stack_cache_dir

    identity = pkgindex.config_identity()
    if identity is None:
        pytest.skip("pip's config locations are known on Linux only")
    entry = stack_cache_dir() / pkgindex.PIP_SETTINGS_DIR / f"{identity}.json"
    entry.parent.mkdir(parents=True)
    entry.write_text(json.dumps({"global.index-url": 3}))  # not pip's shape
    assert pkgindex.kept_pip_settings()["global.index-url"] == "https://example.invalid/simple"
    assert len(counted_pip) == 1


def test_one_session_serves_every_source_and_both_questions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    unearth = pytest.importorskip("unearth")
    from unearth import fetchers

    links = tmp_path / "links"
    links.mkdir()
    (links / "other_pkg-1.0.tar.gz").write_bytes(b"")  # a folder with files, none of the asked release
    index = tmp_path / "simple"
    (index / "flash-mla").mkdir(parents=True)
    (index / "flash-mla" / "index.html").write_text("<html><body></body></html>\n")
    sources = pkgindex.Sources((pkgindex.IndexSource(str(links), "find-links", "test"),
                                pkgindex.IndexSource(index.as_uri(), "index", "test")))
    made: list[object] = []
    real = fetchers.PyPIClient

    class Counted(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args: object, **kwargs: object) -> None:
            made.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(fetchers, "PyPIClient", Counted)
    finders: list[object] = []
    real_finder = unearth.PackageFinder

    def counted_finder(*args: object, **kwargs: object) -> object:
        finder = real_finder(*args, **kwargs)
        finders.append(finder)
        return finder

    monkeypatch.setattr(unearth, "PackageFinder", counted_finder)
    got = pkgindex.fetch("flash_mla", "1.0.1", tmp_path / "dest", sources)
    assert isinstance(got, pkgindex.NotFetched) and got.definitive
    assert "is on none of" in got.why and str(links) in got.why and index.as_uri() in got.why
    assert len(finders) == 2  # one per source, asked for the release and for its post-releases
    assert len(made) == 1  # one session (one SSL context) for both finders
    assert all(f.session is made[0] for f in finders)
