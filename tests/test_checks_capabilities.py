# Advertised vs implemented: what a backend class tells the selector against the guards of its impl,
# with the branch a guard sits under and upstream's counterpart (an inherited guard is info).
from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from conftest import write_tree

from metax_audit.cache.memo import review_memo
from metax_audit.core.models import BackendChain, ChainHop, Discovery, Finding, Severity, SourceFile, TraceResult
from metax_audit.stages.checks.capabilities import check_capabilities
from metax_audit.stages.checks.memo import FileMemo

BACKEND = '''
class AttentionType:
    DECODER = "decoder"
    ENCODER_ONLY = "encoder_only"

class MyBackend:
    supported_kv_cache_dtypes = ["auto", "fp8", "fp8_e4m3"]

    @staticmethod
    def get_supported_head_sizes():
        return [64, 128, 96]

    @classmethod
    def supports_sink(cls):
        return True

    @classmethod
    def supports_sliding_window(cls):
        """docstring is fine"""
        return True

    @classmethod
    def supports_attn_type(cls, attn_type):
        return attn_type in (AttentionType.DECODER, AttentionType.ENCODER_ONLY)


class MyImpl:
    def __init__(self, num_heads, head_size, kv_cache_dtype, sinks=None, sliding_window=None, attn_type=None,
                 alibi_slopes=None, logits_soft_cap=None):
{guard}

    def forward(self, q):
{forward}
        return q
'''
CASES = {
    # guard in __init__, the forward body
    "fp8_raises": ('        if kv_cache_dtype.startswith("fp8"):\n            raise NotImplementedError("no fp8")', "        pass",
                   "MXA180", Severity.ERROR),
    "quantized_raises": ('        if is_quantized_kv_cache(kv_cache_dtype):\n            raise ValueError("no")', "        pass",
                         "MXA180", Severity.ERROR),
    "sinks_raise": ('        if sinks is not None:\n            raise NotImplementedError("sinks")', "        pass",
                    "MXA180", Severity.ERROR),
    "features_list": ('        unsupported = [alibi_slopes, sliding_window, logits_soft_cap]\n        if any(unsupported):\n'
                      '            raise NotImplementedError("x")', "        pass", "MXA180", Severity.ERROR),
    "head_assert": ("        assert head_size in (64, 128)", "        pass", "MXA180", Severity.ERROR),
    "encoder_in_forward": ("        pass", "        assert self.attn_type == AttentionType.DECODER", "MXA181", Severity.WARNING),
    # negative cases
    "alibi_only": ('        if alibi_slopes is not None:\n            raise NotImplementedError("alibi")', "        pass", None, None),
    "always_raises": ('        if True:\n            raise NotImplementedError("never built")', "        pass", None, None),
    "other_dtype": ('        if kv_cache_dtype == "int8":\n            raise NotImplementedError("int8")', "        pass", None, None),
    "under_exclusive_branch": ("        pass", "        if self.attn_type == AttentionType.ENCODER_ONLY:\n            pass\n"
                               "        else:\n            assert self.attn_type == AttentionType.DECODER", None, None),
    "unknown_test": ("        if self.helper(kv_cache_dtype):\n            raise NotImplementedError()", "        pass", None, None),
    "warns_not_raises": ('        if kv_cache_dtype == "fp8":\n            logger.warning("slow")', "        pass", None, None),
}


def _tree(tmp_path: Path, guard: str, forward: str, upstream_guard: str | None = None) -> tuple[Discovery, TraceResult]:
    files = {"port/__init__.py": "", "port/attn.py": BACKEND.replace("{guard}", guard).replace("{forward}", forward)}
    if upstream_guard is not None:
        files["up/vllm/attn.py"] = BACKEND.replace("{guard}", upstream_guard).replace("{forward}", "        pass")
    write_tree(tmp_path, files)
    text = (tmp_path / "port/attn.py").read_text()
    line = {name: text.splitlines().index(next(ln for ln in text.splitlines() if ln.startswith(f"class {name}"))) + 1
            for name in ("MyBackend", "MyImpl")}
    chain = BackendChain("MINE", "port.attn.MyBackend", None, True, (
        ChainHop("backend", "port.attn.MyBackend", "port/attn.py", line["MyBackend"]),
        ChainHop("impl", "port.attn.MyImpl", "port/attn.py", line["MyImpl"]),
    ), (), ())
    disc = Discovery(tmp_path, "port", (SourceFile("port/attn.py", "port.attn", "glob"),), (), (), (), {})
    return disc, TraceResult((chain,), ())


@pytest.mark.parametrize("case", sorted(CASES))
def test_capability_table(tmp_path: Path, case: str) -> None:
    guard, forward, rule, severity = CASES[case]
    found = list(check_capabilities(*_tree(tmp_path, guard, forward)))
    assert {(f.rule, f.severity) for f in found} == ({(rule, severity)} if rule else set())
    if rule:
        assert found[0].evidence[0].startswith("advertised: port/attn.py:")
        assert found[0].evidence[1].startswith("implemented: port/attn.py:")


def test_fp8_finding_names_each_advertised_value(tmp_path: Path) -> None:
    found = list(check_capabilities(*_tree(tmp_path, *CASES["fp8_raises"][:2])))
    assert sorted(f.message.split("kv-cache dtype ")[1].split(",")[0] for f in found) == ["'fp8'", "'fp8_e4m3'"]


def _memo_transparent(root: Path, run: Callable[[FileMemo | None], Iterable[Finding]]) -> list[Finding]:
    """The findings without a memo, asserting that a cold and then a warm per-file memo (read back from
    the cache, nothing recomputed) give the same."""
    plain = list(run(None))
    for _ in range(2):
        memo = FileMemo(root, memo=review_memo(True))
        assert list(run(memo)) == plain
        memo.save()
    assert memo.hits and not memo.misses
    return plain


def test_guard_inherited_from_upstream_is_info(tmp_path: Path) -> None:
    guard = CASES["sinks_raise"][0]
    disc, trace = _tree(tmp_path, guard, "        pass", upstream_guard=guard)
    found = _memo_transparent(tmp_path, lambda memo: check_capabilities(
        disc, trace, upstream_root=tmp_path / "up", counterparts={"port/attn.py": "vllm/attn.py"}, memo=memo))
    assert [(f.rule, f.severity) for f in found] == [("MXA182", Severity.INFO)]


CAUSAL_PORT = '''
class MyBackend:
    @classmethod
    def supports_non_causal(cls):
        return {non_causal}


class MyBuilder:
    def build(self, m):
        self.prefill.plan(q, causal={port_causal})
        self.cascade.plan(q, causal=True)


class MyImpl:
    pass
{impl_check}
'''
CAUSAL_UPSTREAM = '''
class Builder:
    def build(self, m):
        self.prefill.plan(q, causal=m.causal)
        self.cascade.plan(q, causal=True)
'''


ASSERTS_FLAG = """
    def forward(self, m, wrapper):
        assert wrapper._causal == m.causal
"""


@pytest.mark.parametrize(("non_causal", "port_causal", "impl_check", "expected"), [
    ("True", "True", "", ["MXA183"]),  # advertised non-causal, flag fixed where upstream passes the request's
    ("True", "True", ASSERTS_FLAG, ["MXA183"]),  # ... and the impl asserts the planned flag is the request's: an error
    ("False", "True", "", []),  # not advertised: a causal-only backend may fix it
    ("True", "m.causal", "", []),  # follows upstream
])
def test_causal_flag_against_advertised_non_causal(tmp_path: Path, non_causal: str, port_causal: str, impl_check: str,
                                                   expected: list[str]) -> None:
    text = CAUSAL_PORT.replace("{non_causal}", non_causal).replace("{port_causal}", port_causal).replace("{impl_check}", impl_check)
    write_tree(tmp_path, {"port/attn.py": text, "up/vllm/attn.py": CAUSAL_UPSTREAM})
    lines = text.splitlines()
    at = {n: next(i for i, ln in enumerate(lines, 1) if ln.startswith(f"class {n}")) for n in ("MyBackend", "MyBuilder", "MyImpl")}
    chain = BackendChain("MINE", "port.attn.MyBackend", None, True, (
        ChainHop("backend", "port.attn.MyBackend", "port/attn.py", at["MyBackend"]),
        ChainHop("builder", "port.attn.MyBuilder", "port/attn.py", at["MyBuilder"]),
        ChainHop("impl", "port.attn.MyImpl", "port/attn.py", at["MyImpl"]),
    ), (), ())
    disc = Discovery(tmp_path, "port", (SourceFile("port/attn.py", "port.attn", "glob"),), (), (), (), {})
    found = _memo_transparent(tmp_path, lambda memo: check_capabilities(
        disc, TraceResult((chain,), ()), upstream_root=tmp_path / "up", counterparts={"port/attn.py": "vllm/attn.py"},
        memo=memo))
    assert [f.rule for f in found] == expected
    if expected:
        assert found[0].severity is (Severity.ERROR if impl_check else Severity.WARNING)
        assert found[0].evidence[2] == "upstream: vllm/attn.py:4: self.prefill.plan(q, causal=m.causal)"
    if impl_check:
        assert found[0].message.startswith("AssertionError when a non-causal request runs")
        assert any(x.kind == "assert" and "wrapper._causal == m.causal" in x.detail for x in found[0].sites)


# An MLA-style layer: the impl's base (beside the layer) sets the flag the layer's quantized path reads.
OOT_LAYER = '''
class _QuantOp(CustomOp):
    def forward_oot(self, *args, **kwargs):
        raise NotImplementedError("not on this device")


class Layer:
    def __init__(self):
        self._quant_op = _QuantOp()

    def forward_impl(self, q):
        fp8 = is_quantized_kv_cache(self.kv_cache_dtype)
        if fp8 and self.impl.supports_quant_query_input:
            q = self._quant_op(q)
        return self.impl.forward_mqa(q)


class CommonImpl:
    def __init__(self):
        self.supports_quant_query_input = True
'''
OOT_BACKEND = '''
class MyBackend:
    supported_kv_cache_dtypes = ["auto", {dtypes}]


class MyImpl(CommonImpl[int]):
{impl_body}
'''


def _oot_findings(tmp_path: Path, layer: str, backend: str) -> list:
    """The MXA184 findings of the layer and backend files, traced as backend MINE."""
    write_tree(tmp_path, {"port/layer.py": layer, "port/attn.py": backend})
    lines = backend.splitlines()
    at = {n: next(i for i, ln in enumerate(lines, 1) if ln.startswith(f"class {n}")) for n in ("MyBackend", "MyImpl")}
    chain = BackendChain("MINE", "port.attn.MyBackend", None, True, (
        ChainHop("backend", "port.attn.MyBackend", "port/attn.py", at["MyBackend"]),
        ChainHop("impl", "port.attn.MyImpl", "port/attn.py", at["MyImpl"]),
    ), (), ())
    disc = Discovery(tmp_path, "port", (SourceFile("port/attn.py", "port.attn", "glob"), SourceFile("port/layer.py", "port.layer", "glob")),
                     (), (), (), {})
    return [f for f in check_capabilities(disc, TraceResult((chain,), ())) if f.rule == "MXA184"]


@pytest.mark.parametrize(("dtypes", "impl_body", "expected"), [
    ('"fp8"', "    pass", ["MXA184"]),  # advertised fp8, the impl inherits the flag: the only path raises
    ('"bfloat16"', "    pass", []),  # no quantized dtype advertised
    ('"fp8"', "    def __init__(self):\n        self.supports_quant_query_input = False", []),  # the impl opts out
])
def test_an_advertised_dtype_whose_only_path_raises_on_the_vendor_is_an_error(tmp_path: Path, dtypes: str, impl_body: str,
                                                                               expected: list[str]) -> None:
    found = _oot_findings(tmp_path, OOT_LAYER, OOT_BACKEND.replace("{dtypes}", dtypes).replace("{impl_body}", impl_body))
    assert [f.rule for f in found] == expected
    if expected:
        assert found[0].severity is Severity.ERROR and found[0].message.startswith("NotImplementedError when MINE runs with a 'fp8' KV cache")
        assert {x.kind for x in found[0].sites} == {"advertised", "call", "raise"}
        assert "with that CustomOp enabled (compilation_config.custom_ops)" in found[0].message


def test_an_op_built_with_enforce_enable_is_raised_into_whatever_custom_ops_says(tmp_path: Path) -> None:
    layer = OOT_LAYER.replace("self._quant_op = _QuantOp()", "self._quant_op = _QuantOp(enforce_enable=True)")
    [found] = _oot_findings(tmp_path, layer, OOT_BACKEND.replace("{dtypes}", '"fp8"').replace("{impl_body}", "    pass"))
    assert "(it is built with enforce_enable=True, so always enabled)" in found.message
    assert "custom_ops" not in found.message


UPSTREAM_LAYER = '''
class _QuantOp(QuantFP8):
    def _concat(self, a, b):
        return cat(a, b)

    forward_native = _make_forward(QuantFP8.forward_native)
'''


def test_a_disabled_op_is_no_way_out_when_the_port_drops_upstreams_forward_native(tmp_path: Path) -> None:
    # vllm_metax master's _DecodeConcatQuantFP8: upstream's class defines forward_native (the concatenating one); the
    # port's defines only forward_oot, so a disabled op runs the base class's forward_native instead
    layer = OOT_LAYER.replace("class _QuantOp(CustomOp):", "class _QuantOp(QuantFP8):")
    backend = OOT_BACKEND.replace("{dtypes}", '"fp8"').replace("{impl_body}", "    pass")
    write_tree(tmp_path, {"port/layer.py": layer, "port/attn.py": backend, "up/vllm/layer.py": UPSTREAM_LAYER})
    lines = backend.splitlines()
    at = {n: next(i for i, ln in enumerate(lines, 1) if ln.startswith(f"class {n}")) for n in ("MyBackend", "MyImpl")}
    chain = BackendChain("MINE", "port.attn.MyBackend", None, True, (
        ChainHop("backend", "port.attn.MyBackend", "port/attn.py", at["MyBackend"]),
        ChainHop("impl", "port.attn.MyImpl", "port/attn.py", at["MyImpl"]),
    ), (), ())
    disc = Discovery(tmp_path, "port", (SourceFile("port/attn.py", "port.attn", "glob"), SourceFile("port/layer.py", "port.layer", "glob")),
                     (), (), (), {})

    def found(counterparts: dict[str, str]) -> Finding:
        [f] = [f for f in check_capabilities(disc, TraceResult((chain,), ()), upstream_root=tmp_path / "up",
                                             counterparts=counterparts) if f.rule == "MXA184"]
        return f

    f = found({"port/layer.py": "vllm/layer.py"})
    assert f.severity is Severity.ERROR
    assert f.message.endswith("its forward_oot only raises; disabled, it runs QuantFP8.forward_native, not the "
                              "forward_native upstream's _QuantOp defines")
    assert f.evidence[-1] == ("disabled: port/layer.py:2: the port's _QuantOp defines no forward_native, so a disabled op "
                              "runs the inherited QuantFP8.forward_native; upstream's class defines its own: vllm/layer.py:6: "
                              "forward_native = _make_forward(QuantFP8.forward_native)")
    # the port keeps upstream's forward_native, or there is no counterpart: the disabled op is the way out, as before
    assert "disabled," not in found({}).message
    write_tree(tmp_path, {"port/layer.py": layer.replace("    def forward_oot", "    forward_native = upstream_native\n\n    def forward_oot")})
    assert "disabled," not in found({"port/layer.py": "vllm/layer.py"}).message


def test_a_class_level_list_appended_to_on_every_config_check_is_a_warning(tmp_path: Path) -> None:
    from metax_audit.stages.checks.capabilities import check_config_hook_appends

    platform = ("class VendorPlatform:\n    @classmethod\n    def check_and_update_config(cls, vllm_config):\n"
                "        cc = vllm_config.compilation_config\n        cc._attention_ops.append('vllm::mine')\n"
                "        cc.custom_ops.append('none')\n")
    upstream = ("from typing import ClassVar\n\nclass CompilationConfig:\n    _attention_ops: ClassVar[list[str]] = []\n"
                "    custom_ops: list[str] = []\n")
    write_tree(tmp_path, {"port/platform.py": platform, "up/vllm/config/compilation.py": upstream})
    found = list(check_config_hook_appends(tmp_path, "port/platform.py", tmp_path / "up"))
    # the ClassVar list grows with every config check; an instance field (custom_ops) does not
    assert [(f.rule, f.severity, f.location.line) for f in found] == [("MXA185", Severity.WARNING, 5)]
    assert "vllm/config/compilation.py:4" in found[0].evidence[1]
