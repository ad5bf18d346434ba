# Table tests for compare: (upstream source, port source, expected differences), built as tiny
# package trees in tmp_path; plus counterpart mapping, vendor-only files and the three-way view.
from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from metax_audit.core.config import AuditConfig
from metax_audit.core.models import Discovery, SourceFile, UpstreamInfo
from metax_audit.stages.compare import compare

REL = "v1/attention/backends/demo.py"
REGISTRY = '''\
from enum import Enum


class AttentionBackendEnum(Enum):
    FLASH = (
        "vllm.v1.attention.backends.demo."
        "FlashBackend"
    )
    OTHER = "vllm.v1.attention.backends.other.OtherBackend"
'''


def _write(root: Path, rel: str, src: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(src), encoding="utf-8")


def _run(tmp_path: Path, upstream_src: str | None, port_src: str, base_src: str | None = None, rel: str = REL,
         config: AuditConfig | None = None):
    port_root, up_root, base_root = tmp_path / "port", tmp_path / "up", tmp_path / "base"
    _write(port_root, f"vllm_metax/{rel}", port_src)
    _write(up_root, "vllm/v1/attention/backends/registry.py", REGISTRY)
    if upstream_src is not None:
        _write(up_root, f"vllm/{REL}", upstream_src)
    up = UpstreamInfo("vllm", "0.26.0", "directory:test", up_root)
    base = None
    if base_src is not None:
        _write(base_root, f"vllm/{REL}", base_src)
        base = UpstreamInfo("vllm", "0.25.0", "directory:base", base_root)
    disc = Discovery(port_root, "vllm_metax", (SourceFile(f"vllm_metax/{rel}", "", "glob"),), (), (), (), {})
    comparison, findings = compare(disc, config or AuditConfig(), up, base)
    (fc,) = comparison.files
    return comparison, fc, findings


def _kinds(fc) -> set[tuple[str, str, bool]]:
    return {(d.kind, d.symbol, d.declared) for d in fc.differences if d.kind != "cosmetic"}


@dataclass(frozen=True)
class Case:
    name: str
    upstream: str
    port: str
    expected: set[tuple[str, str, bool]]


CASES = [
    Case(
        "moved method is not a difference",
        """\
        class Impl:
            def a(self):
                return 1

            def b(self, x):
                return x + 1
        """,
        """\
        class Impl:
            def b(self, x):
                return x + 1

            def a(self):
                return 1
        """,
        set(),
    ),
    Case(
        "renamed class maps by stripped prefix",
        """\
        class FlashBackend:
            def get_name(self):
                return "FLASH"
        """,
        """\
        class MacaFlashBackend:
            def get_name(self):
                return "FLASH"
        """,
        set(),
    ),
    Case(
        "declared block",
        """\
        class Impl:
            def forward(self, q):
                out = kernel(q)
                return out
        """,
        """\
        class Impl:
            def forward(self, q):
                out = kernel(q)
                # /---- Metax Modification ----\\
                # vendor kernel returns a padded head dim
                out = out[..., :64]
                # \\---- Metax Modification ----/
                return out
        """,
        {("added", "Impl.forward", True)},
    ),
    Case(
        "undeclared change",
        """\
        class Impl:
            def forward(self, q):
                return kernel(q, causal=True)
        """,
        """\
        class Impl:
            def forward(self, q):
                return kernel(q, causal=False)
        """,
        {("changed", "Impl.forward", False)},
    ),
    Case(
        "copied arch check is reported although unchanged",
        """\
        class Impl:
            def __init__(self, dtype):
                if dtype == "fp8" and not current_platform.has_device_capability(89):
                    raise ValueError("fp8 needs sm89")
        """,
        """\
        class Impl:
            def __init__(self, dtype):
                if dtype == "fp8" and not current_platform.has_device_capability(89):
                    raise ValueError("fp8 needs sm89")
        """,
        {("arch-check", "Impl.__init__", False)},
    ),
    Case(
        "calling the backend's own capability hook is not an NVIDIA check",
        """\
        class Base:
            @classmethod
            def validate(cls, cap):
                if not cls.supports_compute_capability(cap):
                    raise ValueError("unsupported")
        """,
        """\
        class Base:
            @classmethod
            def validate(cls, cap):
                if not cls.supports_compute_capability(cap):
                    raise ValueError("unsupported")
        """,
        set(),
    ),
    Case(
        "commented-out argument",
        """\
        def run(q, o, lse):
            kernel(q, out=o, return_lse=lse)
        """,
        """\
        def run(q, o, lse):
            kernel(
                q,
                out=o,
                # return_lse=lse,
            )
        """,
        {("argument-commented-out", "run", False)},
    ),
    Case(
        "kernel import swapped to the vendor package, declared by the comment above",
        """\
        from vllm.v1.attention.ops.merge import merge_states
        """,
        """\
        # use the vendor merge kernel
        from vllm_metax.v1.attention.ops.merge import merge_states
        """,
        {("vendor-kernel-import", "merge_states", True)},
    ),
    Case(
        "feature disabled by a raise",
        """\
        class Builder:
            def cascade(self):
                return make_wrapper()
        """,
        """\
        class Builder:
            def cascade(self):
                raise NotImplementedError("no cascade")
        """,
        {("feature-disabled", "Builder.cascade", False)},
    ),
    Case(
        "class attribute narrowed",
        """\
        class FlashBackend:
            supported_dtypes = ["float16", "bfloat16", "fp8"]
        """,
        """\
        class MacaFlashBackend:
            supported_dtypes = ["float16", "bfloat16"]
        """,
        {("class-attribute", "FlashBackend.supported_dtypes", False)},
    ),
    Case(
        "signature changed",
        """\
        def plan(a, b=1):
            return a + b
        """,
        """\
        def plan(a, b=2):
            return a + b
        """,
        {("signature-changed", "plan", False)},
    ),
    Case(
        "removed method declared by a vendor comment naming it",
        """\
        class Impl:
            def a(self):
                return 1

            def fused_quant(self):
                return 2
        """,
        """\
        # Note: the vendor stack lacks fused_quant
        class Impl:
            def a(self):
                return 1
        """,
        {("removed", "Impl.fused_quant", True)},
    ),
    Case(
        "fallback added",
        """\
        def run(q):
            return fast(q)
        """,
        """\
        def run(q):
            try:
                return fast(q)
            except RuntimeError:
                return slow(q)
        """,
        {("fallback-added", "run", False)},
    ),
    Case(
        "upstream comment above a change does not declare it",
        """\
        def run(q):
            # Process shared prefix.
            return fast(q, 1)
        """,
        """\
        def run(q):
            # Process shared prefix.
            return fast(q, 2)
        """,
        {("changed", "run", False)},
    ),
]


def _case(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_difference_table(tmp_path: Path, case: Case) -> None:
    _, fc, findings = _run(tmp_path, case.upstream, case.port)
    assert _kinds(fc) == case.expected
    undeclared = {(f.location.symbol) for f in findings if f.rule == "MXA201"}
    expected_undeclared = {s for k, s, d in case.expected if not d and k != "arch-check"}
    assert undeclared == expected_undeclared


def test_declared_reason_is_the_block_text(tmp_path: Path) -> None:
    _, fc, _ = _run(tmp_path, CASES[2].upstream, CASES[2].port)
    (d,) = [d for d in fc.differences if d.kind == "added"]
    assert d.reason == "vendor kernel returns a padded head dim"
    assert d.line == 6 and d.validation


def test_arch_check_produces_arch_finding_with_evidence(tmp_path: Path) -> None:
    _, _, findings = _run(tmp_path, CASES[4].upstream, CASES[4].port)
    (f,) = [f for f in findings if f.rule == "MXA202"]
    assert f.location.line == 3 and "kept from upstream" in f.message
    assert any("demo.py:3" in e for e in f.evidence)


def test_class_map_and_literal_delta(tmp_path: Path) -> None:
    _, fc, _ = _run(tmp_path, _case('class attribute narrowed').upstream, _case('class attribute narrowed').port)
    assert fc.class_map == {"MacaFlashBackend": "FlashBackend"}
    (d,) = fc.differences
    assert "port drops 'fp8'" in d.detail and d.upstream_line == 2


def test_registered_enum_member_maps_an_unrelated_name(tmp_path: Path) -> None:
    up = """\
    class FlashBackend:
        def get_name(self):
            return "FLASH"
    """
    port = """\
    @register_backend(AttentionBackendEnum.FLASH)
    class VendorSpeedyBackend:
        def get_name(self):
            return "FLASH"
    """
    _, fc, _ = _run(tmp_path, up, port)
    assert fc.class_map == {"VendorSpeedyBackend": "FlashBackend"}
    assert _kinds(fc) == set()


def test_vendor_only_file(tmp_path: Path) -> None:
    _, fc, findings = _run(tmp_path, None, "def helper():\n    return 1\n", rel="v1/attention/backends/vendor_utils.py")
    assert fc.vendor_only and fc.upstream_path is None
    assert [f.rule for f in findings] == ["MXA205"]


def test_path_map_override(tmp_path: Path) -> None:
    src = "def f():\n    return 1\n"
    cfg = AuditConfig(path_map={"vllm_metax/v1/moved.py": f"vllm/{REL}"})
    _, fc, _ = _run(tmp_path, src, src, rel="v1/moved.py", config=cfg)
    assert fc.upstream_path == f"vllm/{REL}" and not fc.vendor_only and fc.differences == ()


def test_log_text_change_is_cosmetic_without_finding(tmp_path: Path) -> None:
    up = "def f(x):\n    logger.info('using fa3')\n    return x\n"
    port = "def f(x):\n    logger.info('using vendor fa2')\n    return x\n"
    _, fc, findings = _run(tmp_path, up, port)
    assert [d.kind for d in fc.differences] == ["cosmetic"]
    assert findings == []


BASE = """\
class Impl:
    def forward(self, q, scale):
        return kernel(q, scale=scale)

    def plan(self, n):
        return n
"""
TARGET = """\
class Impl:
    def forward(self, q, scale):
        return kernel(q, scale=scale, return_lse=True)

    def plan(self, n, fixed_split=None):
        return n

    def supports_sliding_window(self):
        return True
"""


def test_three_way_reports_changes_not_followed(tmp_path: Path) -> None:
    comparison, fc, findings = _run(tmp_path, TARGET, BASE, base_src=BASE)
    drift = {(d.kind, d.symbol) for d in comparison.drift}
    assert drift == {
        ("upstream-not-followed", "Impl.forward"),
        ("upstream-not-followed", "Impl.plan"),
        ("upstream-not-followed", "Impl.supports_sliding_window"),
    }
    assert sorted(f.rule for f in findings if f.rule in {"MXA203", "MXA204"}) == ["MXA203"] * 3
    # The two-way differences that are really unfollowed upstream changes say so.
    kinds = {(d.kind, d.symbol) for d in fc.differences}
    assert ("upstream-not-followed", "Impl.supports_sliding_window") in kinds
    assert ("upstream-not-followed", "Impl.plan") in kinds


def test_three_way_notes_changes_taken(tmp_path: Path) -> None:
    comparison, _, findings = _run(tmp_path, TARGET, TARGET, base_src=BASE)
    assert {d.kind for d in comparison.drift} == {"upstream-followed"}
    assert {f.rule for f in findings} == {"MXA204"}
    assert all(f.severity.value == "info" for f in findings)


def test_without_upstream_nothing_is_compared(tmp_path: Path) -> None:
    port_root = tmp_path / "port"
    _write(port_root, f"vllm_metax/{REL}", "x = 1\n")
    disc = Discovery(port_root, "vllm_metax", (SourceFile(f"vllm_metax/{REL}", "", "glob"),), (), (), (), {})
    comparison, findings = compare(disc, AuditConfig(), None)
    assert findings == [] and comparison.files[0].differences == ()


def test_hunk_the_port_kept_from_the_base_release_is_upstream_not_followed(tmp_path: Path) -> None:
    base = "def run(q):\n    return kernel(q)\n"
    target = "def run(q):\n    q = q.contiguous()\n    return kernel(q)\n"
    comparison, fc, findings = _run(tmp_path, target, base, base_src=base)
    (d,) = fc.differences
    assert d.kind == "upstream-not-followed" and d.upstream_line == 2 and not d.declared
    assert [f.rule for f in findings] == ["MXA203"]
    assert comparison.drift == (d,)  # the three-way view lists body hunks too


def test_vendor_change_over_a_changed_upstream_is_not_drift(tmp_path: Path) -> None:
    base = "def run(q):\n    return kernel(q)\n"
    target = "def run(q):\n    return kernel(q.contiguous())\n"
    port = "def run(q):\n    return vendor_kernel(q)\n"
    _, fc, _ = _run(tmp_path, target, port, base_src=base)
    assert [d.kind for d in fc.differences] == ["changed"]


# ---------------------------------------------------------------- noise a maintainer would dismiss


def _run_with(tmp_path: Path, upstream_src: str, port_src: str, extra: dict[str, str], base_src: str | None = None):
    """Like _run, with more port files in scope (rel path under vllm_metax -> source)."""
    port_root = tmp_path / "port"
    for rel, src in extra.items():
        _write(port_root, f"vllm_metax/{rel}", src)
    comparison, fc, findings = _run(tmp_path, upstream_src, port_src, base_src=base_src)
    files = (SourceFile(f"vllm_metax/{REL}", "", "glob"), *(SourceFile(f"vllm_metax/{r}", "", "glob") for r in extra))
    disc = Discovery(port_root, "vllm_metax", files, (), (), (), {})
    up = comparison.upstream
    base = comparison.base
    comparison, findings = compare(disc, AuditConfig(), up, base)
    fc = next(f for f in comparison.files if f.path == f"vllm_metax/{REL}")
    return comparison, fc, [f for f in findings if f.location.path == fc.path]


SWAP_UP = """\
from vllm.v1.attention.backends.utils import get_version, is_available, run_kernel
from vllm.third_party.mla.interface import mla_decode, mla_meta

def f(q):
    return run_kernel(q, get_version(), is_available(), mla_decode(q), mla_meta(q))
"""
SWAP_PORT = """\
from vllm_metax.v1.attention.backends.utils import get_version, is_available, run_kernel
from mla_vendor.interface import mla_decode, mla_meta

def f(q):
    return run_kernel(q, get_version(), is_available(), mla_decode(q), mla_meta(q))
"""


def test_import_block_swapped_to_in_scope_port_module_is_one_info_finding(tmp_path: Path) -> None:
    _, fc, findings = _run_with(tmp_path, SWAP_UP, SWAP_PORT, {"v1/attention/backends/utils.py": "x = 1\n"})
    kinds = sorted((d.kind, d.symbol) for d in fc.differences)
    assert kinds == [("port-module-import", "get_version, is_available, run_kernel"),
                     ("vendor-kernel-import", "mla_decode, mla_meta")]
    by_kind = {f.message.split(" in ")[0]: f for f in findings if f.rule == "MXA201"}
    assert by_kind["port-module-import"].severity.value == "info"
    assert by_kind["vendor-kernel-import"].severity.value == "info"  # the same names from the kernel upstream vendors a copy of
    assert any("upstream vllm/" in e and ":2" in e for e in by_kind["vendor-kernel-import"].evidence)


def test_import_swapped_to_port_module_out_of_scope_is_a_swap_to_the_ports_own_module(tmp_path: Path) -> None:
    _, fc, findings = _run(tmp_path, SWAP_UP, SWAP_PORT)
    assert ("vendor-kernel-import", "get_version, is_available, run_kernel") in {(d.kind, d.symbol) for d in fc.differences}
    # The swap to the port's own module is a known adaptation (info, with the reason); so is taking the same names from
    # the kernel package whose copy upstream vendors (vllm.third_party.mla.interface -> mla_vendor.interface): the
    # import rules check they resolve on the vendor's stack and the calls are bound against it.
    sev = {f.location.symbol: f.severity.value for f in findings if f.rule == "MXA201"}
    assert sev == {"get_version, is_available, run_kernel": "info", "mla_decode, mla_meta": "info"}
    own = next(f for f in findings if f.location.symbol.startswith("get_version"))
    assert any("info: swap to the port's own module" in e for e in own.evidence)


@pytest.mark.parametrize(("upstream", "port", "expected", "rules"), [
    pytest.param(
        "from vllm.kernels.flash_ops import fast_plan, fast_run\n\ndef f(q):\n    return fast_run(fast_plan(q))\n",
        "def f(q):\n    return q\n",
        [("changed", "f")], [("MXA201", "f")],
        id="dropped kernel import whose users went too is folded into the body change"),
    pytest.param(
        "from vllm.kernels.flash_ops import reshape_cache\n\ndef f(q):\n    return reshape_cache(q)\n",
        "if True:\n    reshape_cache = vendor_ops.reshape_cache\n\ndef f(q):\n    return reshape_cache(q)\n",
        [("added", "<module>"), ("changed", "reshape_cache")], [("MXA201", "<module>"), ("MXA201", "reshape_cache")],
        id="name the port binds itself instead of importing is reported at its line"),
    pytest.param(
        "def is_supported(v):\n    from vllm.kernels.flash_ops import is_supported as inner\n    return inner(v)\n\n"
        "def probe():\n    from vllm.kernels.flash_ops import is_supported\n    return is_supported(3)\n",
        "def is_supported(v):\n    from vllm.kernels.flash_ops import is_supported as inner\n    return inner(v)\n\n"
        "def probe():\n    return is_supported(3)\n",
        [], [],
        id="a name upstream also defines is not the port defining it itself"),
    pytest.param(
        "from vllm.logger import init_logger\n\nlogger = init_logger(__name__)\n\ndef f(q):\n    logger.info('x')\n    return q\n",
        "def f(q):\n    return q\n",
        [], [],
        id="removed module logger is cosmetic"),
    pytest.param(
        "class Attn(Base):\n    def __init__(self):\n        super().__init__()\n",
        "class Attn(Base):\n    def __init__(self):\n        super(Attn, self).__init__()\n",
        [], [],
        id="super(Cls, self) is super()"),
])
def test_noise_is_folded(tmp_path: Path, upstream: str, port: str, expected: list[tuple[str, str]],
                         rules: list[tuple[str, str]]) -> None:
    _, fc, findings = _run(tmp_path, upstream, port)
    assert sorted((d.kind, d.symbol) for d in fc.differences if d.kind != "cosmetic") == expected
    assert sorted((f.rule, f.location.symbol) for f in findings) == rules


def test_bound_name_evidence_has_the_port_line(tmp_path: Path) -> None:
    up = "from vllm.kernels.flash_ops import reshape_cache\n\ndef f(q):\n    return reshape_cache(q)\n"
    port = "if True:\n    reshape_cache = vendor_ops.reshape_cache\n\ndef f(q):\n    return reshape_cache(q)\n"
    _, _, findings = _run(tmp_path, up, port)
    (f,) = [f for f in findings if f.location.symbol == "reshape_cache"]
    assert f.location.line == 2 and "defines reshape_cache itself" in f.message
    assert f"upstream vllm/{REL}:1" in f.evidence


def test_members_dropped_at_one_place_are_one_finding(tmp_path: Path) -> None:
    up = "def keep():\n    return 1\n\ndef a(x):\n    return x\n\ndef b(x):\n    return x\n\ndef c(x):\n    return x\n"
    port = "def keep():\n    return 1\n"
    _, fc, findings = _run(tmp_path, up, port)
    assert sorted(d.symbol for d in fc.differences) == ["a", "b", "c"]  # the inventory keeps each member
    (f,) = findings
    assert f.location.symbol == "a, b, c" and "3 upstream members are absent" in f.message
    assert f.location.line == 3 and sum(" [removed] " in e for e in f.evidence) == 3


def test_methods_and_class_attributes_dropped_at_one_place_are_one_finding(tmp_path: Path) -> None:
    up = "class Q(Base):\n    x = 1\n\n    def helper(self):\n        return 1\n\n    fwd = make(helper)\n"
    port = "class Q(Base):\n    x = 1\n"
    _, fc, findings = _run(tmp_path, up, port)
    assert sorted((d.kind, d.symbol) for d in fc.differences) == [("class-attribute", "Q.fwd"), ("removed", "Q.helper")]
    (f,) = findings
    assert f.location.symbol == "Q" and "2 upstream members" in f.message


def test_capability_checks_kept_in_one_function_are_one_finding(tmp_path: Path) -> None:
    src = """\
    class Impl:
        def __init__(self, dtype):
            cap = current_platform.get_device_capability()
            self.n = 1
            if dtype == "fp8" and not current_platform.has_device_capability(89):
                raise ValueError("fp8")
            self.m = 2
            if dtype == "bf16" and not current_platform.has_device_capability(80):
                raise ValueError("bf16")
    """
    _, _, findings = _run(tmp_path, src, src)
    (f,) = [f for f in findings if f.rule == "MXA202"]
    assert f.location.line == 3 and "3 capability checks in Impl.__init__" in f.message
    assert [e.split(" [")[0] for e in f.evidence if " [arch-check] " in e] == [f"vllm_metax/{REL}:{n}" for n in (3, 5, 8)]
    assert "attribution: inherited from upstream 0.26.0, also present there" in f.evidence


def test_hunks_of_one_function_not_followed_are_one_drift_finding(tmp_path: Path) -> None:
    base = "def run(q, k):\n    a = q + 1\n    b = k + 1\n    c = a * b\n    return kernel(a, b, c)\n"
    target = "def run(q, k):\n    a = q + 2\n    b = k + 1\n    c = a * b\n    d = c - 1\n    return kernel(a, b, d)\n"
    _, fc, findings = _run(tmp_path, target, base, base_src=base)
    assert [d.kind for d in fc.differences].count("upstream-not-followed") == 2
    (f,) = [f for f in findings if f.rule == "MXA203"]
    assert "2 upstream changes not followed in run" in f.message
    assert sum(" [upstream-not-followed] " in e for e in f.evidence) == 2
    assert any(e.startswith("attribution: drift: the port keeps the 0.25.0 form") for e in f.evidence)


def test_changed_hunk_says_where_it_differs(tmp_path: Path) -> None:
    args = ", ".join(f"arg{i}=value{i}" for i in range(12))
    up = f"def f(cfg):\n    return Linear({args}, quant_config=cfg)\n"
    port = f"def f(cfg):\n    return Linear({args}, quant_config=cfg if USE_FP8 else None)\n"
    _, fc, findings = _run(tmp_path, up, port)
    (d,) = fc.differences
    assert d.kind == "changed"
    # Both texts are cut before the change; the focus names it.
    assert "quant_config=cfg [upstream: - | port: if USE_FP8 else None]" in d.detail
    assert "USE_FP8" in findings[0].message


@pytest.mark.parametrize(("upstream", "kind", "severity"), [
    ("def builder():\n    if current_platform.is_rocm() or current_platform.is_xpu():\n        return rocm_kernel(q, k_scale)\n"
     "    return DefaultBuilder\n\nBUILDER = builder()\n", "foreign-platform-branch", "info"),
    # With an else branch the port's path changed too: a real difference (no platform file says is_rocm is False).
    ("def builder():\n    if current_platform.is_rocm():\n        return rocm_kernel(q, k_scale)\n    else:\n        return DefaultBuilder\n\nBUILDER = builder()\n",
     "changed", "warning"),
])
def test_dropped_branch_of_another_platform_is_info(tmp_path: Path, upstream: str, kind: str, severity: str) -> None:
    _, fc, findings = _run(tmp_path, upstream, "def builder():\n    return DefaultBuilder\n\nBUILDER = builder()\n")
    assert [d.kind for d in fc.differences] == [kind]
    assert [f.severity.value for f in findings] == [severity]


def test_dropped_branch_of_a_cuda_check_stays_a_warning(tmp_path: Path) -> None:
    up = "def builder():\n    if current_platform.is_cuda():\n        return cuda_kernel(q, k_scale)\n    return DefaultBuilder\n\nBUILDER = builder()\n"
    _, fc, findings = _run(tmp_path, up, "def builder():\n    return DefaultBuilder\n\nBUILDER = builder()\n")
    assert [d.kind for d in fc.differences] == ["removed"]
    assert [f.severity.value for f in findings] == ["warning"]


def test_foreign_branch_upstream_added_after_base_is_not_drift(tmp_path: Path) -> None:
    base = "def builder():\n    return DefaultBuilder\n"
    target = "def builder():\n    if current_platform.is_rocm():\n        return RocmBuilder\n    return DefaultBuilder\n"
    _, fc, findings = _run(tmp_path, target, base, base_src=base)
    assert [d.kind for d in fc.differences] == ["foreign-platform-branch"]
    assert [f.rule for f in findings] == ["MXA201"] and findings[0].severity.value == "info"


def test_renaming_classes_leaves_the_shared_parse_untouched(tmp_path: Path) -> None:
    from metax_audit.core.pysource import cached_parse

    up = "class FlashBackend:\n    pass\n\ndef backend():\n    return FlashBackend\n"
    port = "class MacaFlashBackend:\n    pass\n\ndef backend():\n    return MacaFlashBackend\n"
    _, fc, _ = _run(tmp_path, up, port)
    assert fc.class_map == {"MacaFlashBackend": "FlashBackend"} and fc.differences == ()
    # Later stages (checks) read the same cached tree: they must see the port's own names.
    _, tree = cached_parse(tmp_path / "port" / f"vllm_metax/{REL}")
    assert {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} == {"MacaFlashBackend"}
