# Tests for upstream sourcing: directories, installed distributions, and the pip path with a
# fake pip (monkeypatched subproc.run writing a small wheel), including cache reuse and repair.
from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from metax_audit.core import subproc
from metax_audit.core.errors import UpstreamError
from metax_audit.stages import upstream
from metax_audit.stages.upstream import COMPLETE_MARKER, resolve_upstream


def _make_pkg(root: Path, version: str = "9.8.7") -> Path:
    pkg = root / "vllm"
    (pkg / "v1").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "v1" / "a.py").write_text("X = 1\n")
    (pkg / "_version.py").write_text(f"__version__ = version = '{version}'\n")
    return pkg


def test_directory_holding_package(tmp_path: Path) -> None:
    _make_pkg(tmp_path)
    info = resolve_upstream(str(tmp_path))
    assert info.root == tmp_path.resolve()
    assert info.version == "9.8.7"
    assert info.source == f"directory:{tmp_path.resolve()}"


def test_directory_is_the_package_itself(tmp_path: Path) -> None:
    pkg = _make_pkg(tmp_path)
    info = resolve_upstream(str(pkg))
    assert info.root == tmp_path.resolve()
    assert info.package == "vllm"


def test_version_from_dist_info_when_no_version_module(tmp_path: Path) -> None:
    pkg = _make_pkg(tmp_path)
    (pkg / "_version.py").unlink()
    (tmp_path / "vllm-1.2.3.dist-info").mkdir()
    (tmp_path / "vllm-1.2.3.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 1.2.3\n\nbody\n")
    assert resolve_upstream(str(tmp_path)).version == "1.2.3"


def test_directory_without_package_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(UpstreamError, match="holds no 'vllm' package"):
        resolve_upstream(str(tmp_path))


def test_missing_directory_and_unknown_name_are_errors(tmp_path: Path) -> None:
    with pytest.raises(UpstreamError, match="does not exist"):
        resolve_upstream(str(tmp_path / "nope"))
    with pytest.raises(UpstreamError, match="not an installed distribution"):
        resolve_upstream("surely-not-installed-dist-xyz")


def test_installed_distribution() -> None:
    info = resolve_upstream("pyyaml", package="yaml")
    assert info.source.startswith("installed:pyyaml==")
    assert info.root is not None and (info.root / "yaml").is_dir()


class FakePip:
    """Stands in for `python -m pip download`: writes a wheel holding .py and binary files."""

    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.fail = fail

    def __call__(self, args, **kwargs) -> subproc.Completed:
        self.calls.append(tuple(args))
        # isolated (-I), no bytecode (-B), from a neutral cwd: a pip.py in the caller's cwd is never run
        assert args[1:6] == ["-B", "-I", "-m", "pip", "download"] and "--no-deps" in args
        assert kwargs["cwd"] != Path.cwd() and not any(Path(kwargs["cwd"]).iterdir())
        if self.fail:
            return subproc.Completed(tuple(args), 1, "", f"ERROR: {self.fail}\n")
        dest = Path(args[args.index("-d") + 1])
        pin = args[-1]
        name, version = pin.split("==")
        with zipfile.ZipFile(dest / f"{name}-{version}-py3-none-any.whl", "w") as zf:
            zf.writestr(f"{name}/__init__.py", "")
            zf.writestr(f"{name}/_version.py", f"__version__ = '{version}'\n")
            zf.writestr(f"{name}/v1/backend.py", "class A:\n    pass\n")
            zf.writestr(f"{name}/_C.abi3.so", b"\x7fELF")
            zf.writestr(f"{name}-{version}.dist-info/METADATA", f"Name: {name}\nVersion: {version}\n")
            zf.writestr("../evil.py", "x = 1\n")
        return subproc.Completed(tuple(args), 0, "Saved\n", "")


def test_pip_download_keeps_only_python_and_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakePip()
    monkeypatch.setattr(subproc, "run", fake)
    info = resolve_upstream("vllm==0.26.0", cache_dir=tmp_path)
    entry = tmp_path / "upstream" / "vllm-0.26.0"
    assert info.root == entry and info.version == "0.26.0"
    assert info.source == f"pip:vllm==0.26.0 (cache {entry})"
    assert (entry / "vllm" / "v1" / "backend.py").is_file()
    assert not (entry / "vllm" / "_C.abi3.so").exists()
    assert not (tmp_path / "upstream" / "evil.py").exists()
    assert (entry / COMPLETE_MARKER).is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["upstream"]  # download dir removed
    again = resolve_upstream("vllm==0.26.0", cache_dir=tmp_path)
    assert again == info
    assert len(fake.calls) == 1  # second run is a cache hit


def test_interrupted_extraction_is_redone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakePip()
    monkeypatch.setattr(subproc, "run", fake)
    entry = tmp_path / "upstream" / "vllm-0.25.0"
    (entry / "vllm").mkdir(parents=True)
    (entry / "vllm" / "half.py").write_text("x = (")  # no completion marker
    info = resolve_upstream("vllm==0.25.0", cache_dir=tmp_path)
    assert len(fake.calls) == 1
    assert not (entry / "vllm" / "half.py").exists()
    assert info.version == "0.25.0"


def test_cache_location_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subproc, "run", FakePip())
    monkeypatch.setenv("METAX_AUDIT_CACHE", str(tmp_path / "c"))
    info = resolve_upstream("vllm==1.0.0")
    assert info.root == tmp_path / "c" / "upstream" / "vllm-1.0.0"


def test_pip_failure_is_a_one_line_upstream_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subproc, "run", FakePip(fail="No matching distribution found for vllm==0.0.1"))
    with pytest.raises(UpstreamError) as exc:
        resolve_upstream("vllm==0.0.1", cache_dir=tmp_path)
    assert "No matching distribution" in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "upstream" / "vllm-0.0.1").exists()


def test_wrong_package_in_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subproc, "run", FakePip())
    with pytest.raises(UpstreamError, match="holds no 'vllm' package"):
        resolve_upstream("other==1.0", cache_dir=tmp_path)


def test_pip_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subproc, "run", lambda args, **kw: subproc.Completed(tuple(args), -1, "", "", timed_out=True))
    with pytest.raises(UpstreamError, match="timed out"):
        upstream.resolve_upstream("vllm==1.0", cache_dir=tmp_path)
