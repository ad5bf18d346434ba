# A difference in a class only the port builds is the port's own design, not a sync it missed: info, with the
# constructions as evidence (the shape of vllm-ascend's AscendCompressorStateCache, built by the port's own
# compressor with a block_size upstream's class does not take). It stays a warning when anything else names
# the class (a return hands it to upstream), when upstream changed the member since the base release, or
# when no base release is known.
from __future__ import annotations

from pathlib import Path

from metax_audit.core.config import AuditConfig
from metax_audit.core.models import Severity, UpstreamInfo
from metax_audit.stages.compare import compare
from metax_audit.stages.discover import discover

CFG = AuditConfig(port_package="vllm_npu", scope=("{port}/models/**/*.py",), class_prefixes=("Npu",))
UPSTREAM = (
    "class StateCache:\n"
    "    def __init__(self, dim, prefix):\n"
    "        self.dim = dim\n\n"
    "    def page_size(self, cfg):\n"
    "        return cfg.block_size * self.dim\n")
PORT = (
    "from vllm.models.m.cache import StateCache\n\n\n"
    "class NpuStateCache(StateCache):\n"
    "    def __init__(self, dim, block_size, prefix):\n"
    "        self.dim = dim * block_size\n\n"
    "    def page_size(self, cfg):\n"
    "        return cfg.block_size * self.dim * 2\n\n\n"
    "class NpuCompressor:\n"
    "    def __init__(self, dim):\n"
    "        self.cache = NpuStateCache(dim, 16, 'c')\n")


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    for parent in path.relative_to(root).parents:
        if str(parent) != ".":
            (root / parent / "__init__.py").touch()
    path.write_text(text)


def _findings(tmp: Path, port_text: str = PORT, base_text: str | None = UPSTREAM):
    up, base, port = tmp / "up", tmp / "base", tmp / "port"
    _write(up, "vllm/models/m/cache.py", UPSTREAM)
    if base_text is not None:
        _write(base, "vllm/models/m/cache.py", base_text)
    _write(port, "vllm_npu/models/m/cache.py", port_text)
    target = UpstreamInfo("vllm", "0.99.0", "directory:up", up)
    old = UpstreamInfo("vllm", "0.98.0", "directory:base", base) if base_text is not None else None
    _, findings = compare(discover(port, CFG), CFG, target, old)
    return {f.location.symbol: f for f in findings if f.rule == "MXA201"}


def test_differences_in_a_class_only_the_port_builds_are_info(tmp_path: Path) -> None:
    got = _findings(tmp_path)
    assert set(got) >= {"StateCache.__init__", "StateCache.page_size"}
    for f in (got["StateCache.__init__"], got["StateCache.page_size"]):
        assert f.severity is Severity.INFO
        assert any("a class only the port builds (NpuStateCache, constructed at vllm_npu/models/m/cache.py:14;" in e
                   for e in f.evidence)


def test_a_class_the_port_hands_out_stays_a_warning(tmp_path: Path) -> None:
    handed = PORT + "\n\ndef get_cache_cls():\n    return NpuStateCache\n"
    assert _findings(tmp_path, handed)["StateCache.page_size"].severity is Severity.WARNING


def test_a_member_upstream_changed_since_the_base_stays_a_warning(tmp_path: Path) -> None:
    older = UPSTREAM.replace("return cfg.block_size * self.dim", "return self.dim")
    got = _findings(tmp_path, base_text=older)
    assert got["StateCache.page_size"].severity is Severity.WARNING
    assert got["StateCache.__init__"].severity is Severity.INFO  # unchanged upstream: still the port's own


def test_without_a_base_release_it_stays_a_warning(tmp_path: Path) -> None:
    assert _findings(tmp_path, base_text=None)["StateCache.page_size"].severity is Severity.WARNING
