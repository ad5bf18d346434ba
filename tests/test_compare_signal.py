# Signal before noise: who changed a difference (port-only, drift, inherited), the known vendor
# adaptations that are info with their reason, one finding per root cause, the declaration forms,
# moves and aliases, and the first screen of the report. Tiny upstream/base/port trees per test.
from __future__ import annotations

import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from metax_audit.core.config import AuditConfig
from metax_audit.core.findings import make_finding
from metax_audit.core.models import (
    CallableFact,
    CallSite,
    Category,
    Discovery,
    Finding,
    Location,
    ParamFact,
    Severity,
    Site,
    SourceFile,
    StackFacts,
    UpstreamInfo,
)
from metax_audit.stages.compare import compare
from metax_audit.stages.compare.grouping import hunk_line
from metax_audit.stages.triage import group_per_call, triage

REL = "v1/attention/backends/demo.py"
# An out-of-tree platform that answers one capability predicate with a constant, as a vendor port does.
PLATFORM = """\
class PlatformEnum:
    OOT = "oot"


class VendorPlatform:
    _enum = PlatformEnum.OOT

    @classmethod
    def is_device_capability_family(cls, capability, device_id=0):
        return False
"""


def _write(root: Path, rel: str, src: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(src), encoding="utf-8")


def run(tmp_path: Path, upstream: str, port: str, base: str | None = None, platform: bool = True,
        extra_port: dict[str, str] | None = None) -> tuple[list, list[Finding]]:
    """(differences, findings) of one compared file; the port package holds the platform and `extra_port`."""
    port_root, up_root, base_root = tmp_path / "port", tmp_path / "up", tmp_path / "base"
    _write(port_root, f"vllm_metax/{REL}", port)
    if platform:
        _write(port_root, "vllm_metax/platform.py", PLATFORM)
    for rel, src in (extra_port or {}).items():
        _write(port_root, f"vllm_metax/{rel}", src)
    _write(up_root, f"vllm/{REL}", upstream)
    up = UpstreamInfo("vllm", "0.26.0", "directory:test", up_root)
    base_info = None
    if base is not None:
        _write(base_root, f"vllm/{REL}", base)
        base_info = UpstreamInfo("vllm", "0.25.0", "directory:base", base_root)
    disc = Discovery(port_root, "vllm_metax", (SourceFile(f"vllm_metax/{REL}", "", "glob"),), (), (), (), {})
    comparison, findings = compare(disc, AuditConfig(), up, base_info)
    (fc,) = comparison.files
    return list(fc.differences), findings


def only(findings: list[Finding], rule: str) -> Finding:
    (f,) = [f for f in findings if f.rule == rule]
    return f


def info_reason(f: Finding) -> str:
    return " ".join(e.split(" -- info: ", 1)[1] for e in f.evidence if " -- info: " in e)


# ---------------------------------------------------------------- attribution


def test_port_only_change_is_attributed_to_the_port(tmp_path: Path) -> None:
    base = "def f(q):\n    return kernel(q, scale=1)\n\ndef g(q):\n    return q\n"
    upstream = "def f(q):\n    return kernel(q, scale=1)\n\ndef g(q):\n    return q + 1\n"
    port = "def f(q):\n    return kernel(q, scale=2)\n\ndef g(q):\n    return q + 1\n\nX = f(1)\n"
    _, findings = run(tmp_path, upstream, port, base)
    f = next(f for f in findings if f.rule == "MXA201" and f.location.symbol == "f")
    assert f.severity is Severity.WARNING
    assert "attribution: port-only change (differs from both 0.25.0 and 0.26.0)" in f.evidence


def test_upstream_change_not_followed_is_drift_and_joins_the_functions_port_only_hunks(tmp_path: Path) -> None:
    base = "def f(q, k):\n    a = kernel(q, scale=1)\n    b = k\n    return a, b\n"
    upstream = "def f(q, k):\n    a = kernel(q, scale=2)\n    b = k\n    return a, b\n"
    port = "def f(q, k):\n    a = kernel(q, scale=1)\n    b = k.view(-1)\n    return a, b\n\nX = f(1, 2)\n"
    diffs, findings = run(tmp_path, upstream, port, base)
    assert {d.attribution for d in diffs if d.kind == "upstream-not-followed"} == {"drift"}
    assert not [f for f in findings if f.rule == "MXA201" and f.location.symbol == "f"]  # merged into f's drift finding
    f = only(findings, "MXA203")
    assert "and 1 port-only difference(s) in the same function" in f.message
    assert any(e.startswith("attribution: drift: the port keeps the 0.25.0 form where upstream 0.26.0 changed it") for e in f.evidence)
    assert any("[changed]" in e and "k.view(-1)" in e for e in f.evidence)


def test_unchanged_capability_check_is_inherited_from_upstream(tmp_path: Path) -> None:
    src = "def f(dtype):\n    if dtype == 'fp8' and not current_platform.has_device_capability(89):\n        raise ValueError(dtype)\n\nX = f(1)\n"
    _, findings = run(tmp_path, src, src)
    f = only(findings, "MXA202")
    assert "attribution: inherited from upstream 0.26.0, also present there" in f.evidence
    assert f.severity is Severity.INFO and "inherited unchanged from upstream" in info_reason(f)


def test_without_a_base_the_report_says_drift_was_not_separated(tmp_path: Path) -> None:
    _, findings = run(tmp_path, "def f(q):\n    return kernel(q, scale=1)\n", "def f(q):\n    return kernel(q, scale=2)\n\nX = f(1)\n")
    f = next(f for f in findings if f.rule == "MXA201" and f.location.symbol == "f")
    assert "attribution: drift not separated from the port's own changes (no --base)" in f.evidence


# ---------------------------------------------------------------- demotions: each reason


DEMOTIONS = {
    "swap to the port's own class": (
        "def build():\n    return FlashBuilder(block_size=16)\n\nX = build()\n",
        "class MacaFlashBuilder:\n    pass\n\ndef build():\n    return MacaFlashBuilder(block_size=16)\n\nX = build()\n",
        "swap to the port's own class or op: FlashBuilder -> MacaFlashBuilder"),
    "swap to the port's own op": (
        "def run(q):\n    return torch.ops.vllm.flash_fwd(q)\n\nX = run(1)\n",
        "direct_register_custom_op(op_name='maca_flash_fwd', op_func=None)\n\ndef run(q):\n    return torch.ops.vllm.maca_flash_fwd(q)\n\nX = run(1)\n",
        "swap to the port's own class or op: flash_fwd -> maca_flash_fwd"),
    "field only the port adds": (
        "class Builder:\n    def __init__(self, cfg):\n        self.cfg = cfg\n",
        "class Builder:\n    def __init__(self, cfg):\n        self.cfg = cfg\n        self.kv_cache_dtype = cfg.dtype\n",
        "a field only the port adds"),
    "capability floor replaced by the vendor's answer": (
        "class Backend:\n    @classmethod\n    def supports_compute_capability(cls, capability):\n        return capability >= DeviceCapability(8, 0)\n",
        "class Backend:\n    @classmethod\n    def supports_compute_capability(cls, capability):\n        return True\n",
        "capability floor replaced by the vendor's answer: return True"),
    "predicate constant on the vendor platform": (
        "def pad(q):\n    n = 128 if current_platform.is_device_capability_family(100) else 64\n    return kernel(q, n)\n\nX = pad(1)\n",
        "def pad(q):\n    n = 128 if current_platform.is_device_capability_family(100) else 64\n    return kernel(q, n)\n\nX = pad(1)\n",
        "predicate constant on the vendor platform: is_device_capability_family(...) is False: vllm_metax/platform.py:9 "
        "VendorPlatform.is_device_capability_family returns False"),
    "removed guard that always fired on the vendor: the port turns the path on": (
        "def supported():\n    if not current_platform.is_device_capability_family(90):\n        return False, 'Hopper only'\n"
        "    return True, None\n\nX = supported()\n",
        "def supported():\n    return True, None\n\nX = supported()\n",
        "upstream's guard always fired on the vendor platform, so removing it turns this path on there"),
    "removed guard that never fired on the vendor: nothing changes": (
        "def supported():\n    if current_platform.is_device_capability_family(90):\n        return False, 'not on Hopper'\n"
        "    return True, None\n\nX = supported()\n",
        "def supported():\n    return True, None\n\nX = supported()\n",
        "the port drops a branch `if current_platform.is_device_capability_family(90)` never runs there"),
    "path the vendor never runs: a branch another platform takes": (
        "def run(q):\n    if current_platform.is_rocm():\n        return rocm_kernel(q, scale=2)\n    else:\n        return kernel(q)\n\nX = run(1)\n",
        "def run(q):\n    return kernel(q)\n\nX = run(1)\n",
        "the port's code is upstream's as the vendor platform runs it (is_rocm() is False on an out-of-tree platform"),
    "path the vendor never runs: inside a branch the platform never takes": (
        "def run(q):\n    if current_platform.is_cuda():\n        q = kernel(q, scale=1)\n    return q\n\nX = run(1)\n",
        "def run(q):\n    if current_platform.is_cuda():\n        q = kernel(q, scale=2)\n    return q\n\nX = run(1)\n",
        "a path the vendor never runs: inside `if current_platform.is_cuda()` (never taken there: is_cuda() is False"),
    "path the vendor never runs: a function the port never calls": (
        "def _dequant(kv, k_scale):\n    return kv * k_scale\n",
        "def _dequant(kv, k_scale):\n    return kv / k_scale\n",
        "a path the vendor never runs: _dequant is never referenced in the port package outside its own definition"),
    "path the vendor never runs: the port rejects the case up front": (
        "def run(q, sinks):\n    return kernel(q, sinks=sinks)\n\nX = run(1, 2)\n",
        "def run(q, sinks):\n    if sinks is not None:\n        raise NotImplementedError('sinks')\n    return kernel(q, sinks=sinks)\n\nX = run(1, 2)\n",
        "the port rejects this case up front (raise/assert): a path it does not run"),
    "no kernel argument changes": (
        "def describe(q):\n    logger.info('using flash')\n    return name_of(q)\n\nX = describe(1)\n",
        "def describe(q):\n    return title_of(q)\n\nX = describe(1)\n",
        "no kernel argument, dtype, scale, layout, LSE, causal or shape expression changes"),
    "capability answered by the port": (
        "def flash_attn_supports_fp8():\n    return not current_platform.is_xpu() and has_fa3()\n\nX = flash_attn_supports_fp8()\n",
        "def flash_attn_supports_fp8():\n    return False\n\nX = flash_attn_supports_fp8()\n",
        "capability replaced by the vendor's answer: flash_attn_supports_fp8 returns False on the port"),
    "the port narrows a supported list": (
        "class Backend:\n    supported_kv_cache_dtypes = ['auto', 'bfloat16', 'fp8']\n",
        "class Backend:\n    supported_kv_cache_dtypes = ['auto', 'bfloat16']\n",
        "the port narrows the list: the values it drops are refused at backend selection"),
    "the port adds a value to a supported list": (
        "class Backend:\n    supported_kv_cache_dtypes = ['auto', 'fp8']\n",
        "class Backend:\n    supported_kv_cache_dtypes = ['auto', 'fp8', 'bfloat16']\n",
        "a capability the port adds to upstream's list"),
    "a vendor feature behind a dtype switch, and the code that uses what it chose": (
        "def run(q, kv, cache_dtype):\n    out = gather_fp8(kv)\n    return attend(q, out)\n\nX = run(1, 2, 3)\n",
        "def run(q, kv, cache_dtype):\n    gather = gather_fp8 if cache_dtype == 'fp8' else gather_bf16\n    out = gather(kv)\n"
        "    return attend(q, out)\n\nX = run(1, 2, 3)\n",
        "a vendor feature behind its own switch: the port branches on `cache_dtype == 'fp8'`"),
    "a change inside the branch a vendor switch governs": (
        "def run(x, w):\n    if use_fp8:\n        x = x.to(w.dtype)\n    return attend(x)\n\nX = run(1, 2)\n",
        "def run(x, w):\n    if use_fp8 and w.dtype != torch.int8:\n        x = x.to(w.kind)\n    return attend(x)\n\nX = run(1, 2)\n",
        "(inside the branch the switch at line 2 governs)"),
    "a vendor feature behind a flag __init__ sets from a dtype test": (
        "class Builder:\n    def __init__(self, cfg):\n        self.n = cfg.n\n\n    def build(self, m):\n"
        "        if self.n:\n            extra = plan_a(m)\n        return extra\n\nX = Builder(1).build(2)\n",
        "class Builder:\n    def __init__(self, cfg):\n        self.n = cfg.n\n        self.use_half_kv = cfg.cache_dtype in ['auto', 'bfloat16']\n\n"
        "    def build(self, m):\n        if self.n:\n            extra = plan_a(m)\n        elif self.use_half_kv:\n"
        "            extra = decode_kernel(m, scale=2)\n        return extra\n\nX = Builder(1).build(2)\n",
        "a dtype test: Builder.__init__ sets self.use_half_kv = cfg.cache_dtype in ['auto', 'bfloat16']"),
    "a vendor feature behind the port's own env switch": (
        "def make(q):\n    return Linear(q, quant=None)\n\nX = make(1)\n",
        "import vllm_metax.envs as port_envs\n\n\ndef make(q):\n    return Linear(q, quant=cfg if port_envs.USE_FP8 else None)\n\nX = make(1)\n",
        "(port_envs is the port's own)"),
}


@pytest.mark.parametrize(("upstream", "port", "reason"), DEMOTIONS.values(), ids=DEMOTIONS.keys())
def test_known_vendor_adaptation_is_info_with_its_reason(tmp_path: Path, upstream: str, port: str, reason: str) -> None:
    _, findings = run(tmp_path, upstream, port)
    relevant = [f for f in findings if f.rule in {"MXA201", "MXA202", "MXA203"}]
    assert relevant and all(f.severity is Severity.INFO for f in relevant), [(f.rule, f.severity, f.evidence) for f in relevant]
    assert any(reason in info_reason(f) for f in relevant), [info_reason(f) for f in relevant]


def test_a_flag_init_sets_from_no_dtype_test_is_no_vendor_switch(tmp_path: Path) -> None:
    # the same branch on a flag __init__ sets from a config value (not a dtype test) keeps its weight
    upstream = ("class Builder:\n    def __init__(self, cfg):\n        self.n = cfg.n\n\n    def build(self, m):\n"
                "        if self.n:\n            extra = plan_a(m)\n        return extra\n\nX = Builder(1).build(2)\n")
    port = ("class Builder:\n    def __init__(self, cfg):\n        self.n = cfg.n\n        self.fast = cfg.fast_path\n\n"
            "    def build(self, m):\n        if self.n:\n            extra = plan_a(m)\n        elif self.fast:\n"
            "            extra = decode_kernel(m, scale=2)\n        return extra\n\nX = Builder(1).build(2)\n")
    _, findings = run(tmp_path, upstream, port)
    assert any(f.rule == "MXA201" and f.severity is Severity.WARNING and f.location.symbol == "Builder.build" for f in findings)


def test_kernel_argument_change_stays_a_warning(tmp_path: Path) -> None:
    _, findings = run(tmp_path, "def run(q, lse):\n    return merge_attn_states(q, [x * LN2 for x in lse])\n\nX = run(1, 2)\n",
                      "def run(q, lse):\n    return merge_attn_states(q, lse)\n\nX = run(1, 2)\n")
    f = only(findings, "MXA201")
    assert f.severity is Severity.WARNING
    assert any(e.endswith("-- may change what a kernel computes or whether it runs") for e in f.evidence)


def test_without_a_platform_file_other_platform_branches_are_not_assumed_dead(tmp_path: Path) -> None:
    _, findings = run(tmp_path, "def run(q):\n    if current_platform.is_cuda():\n        q = kernel(q, scale=1)\n    return q\n\nX = run(1)\n",
                      "def run(q):\n    if current_platform.is_cuda():\n        q = kernel(q, scale=2)\n    return q\n\nX = run(1)\n", platform=False)
    assert only(findings, "MXA201").severity is Severity.WARNING


def test_a_method_upstream_code_calls_through_the_subclass_is_not_never_called(tmp_path: Path) -> None:
    upstream = "class Attn(Base):\n    def _insert(self, kv, k_scale):\n        return kv * k_scale\n\n    def forward(self, kv):\n        return self._insert(kv, 1)\n"
    port = "class Attn(Base):\n    def _insert(self, kv, k_scale):\n        return kv / k_scale\n\n    def forward(self, kv):\n        return self._insert(kv, 1)\n"
    _, findings = run(tmp_path, upstream, port.replace("    def forward(self, kv):\n        return self._insert(kv, 1)\n", ""))
    f = next(f for f in findings if f.rule == "MXA201" and f.location.symbol == "Attn._insert")
    assert f.severity is Severity.WARNING  # upstream's forward, inherited through Base, may call the override


def test_dropped_keyword_the_installed_kernel_lacks_is_info_with_the_signature() -> None:
    # The hunk is typed (its keyword changes); the evidence line is its rendering, replaced when it is explained.
    hunk = Site("vllm_metax/x.py", 10, "f", "argument-commented-out",
                "argument(s) wrapper.plan:fixed_split_size commented out: upstream: ...", keywords=("wrapper.plan:-fixed_split_size",))
    f = make_finding("MXA201", Location("vllm_metax/x.py", 10, "f"), "argument-commented-out in f", [hunk_line(hunk)], sites=[hunk])
    call = CallSite(Location("vllm_metax/x.py", 11), "f", "wrapper.plan", "fi.Wrapper.plan", "external")
    params = (ParamFact("self", "POSITIONAL_OR_KEYWORD"), ParamFact("indptr", "POSITIONAL_OR_KEYWORD"))
    facts = StackFacts("py", "t", "h", {"fi.Wrapper.plan": CallableFact("fi.Wrapper.plan", "ok", "import", "(self, indptr)", params)})
    (got,) = triage([f], [call], facts)
    assert got.severity is Severity.INFO
    assert "info: keyword(s) fixed_split_size dropped because the installed fi.Wrapper.plan has no such parameter ((self, indptr))" in got.evidence[0]
    assert got.sites[0].verdict.startswith("info: keyword(s) fixed_split_size dropped")
    # The same change against a kernel that has the keyword stays a warning.
    params_kw = (*params, ParamFact("fixed_split_size", "KEYWORD_ONLY", "None"))
    facts_kw = StackFacts("py", "t", "h", {"fi.Wrapper.plan": CallableFact("fi.Wrapper.plan", "ok", "import", "(...)", params_kw)})
    assert triage([f], [call], facts_kw)[0].severity is Severity.WARNING


@pytest.mark.parametrize(("extended", "added_kernel_has", "severity"), [
    (True, True, Severity.INFO),  # the call follows the bound kernel; the extension keyword is counted unchecked
    (False, True, Severity.WARNING),  # the added keyword the public base lacks is not one a vendor build may add
    (True, False, Severity.WARNING),  # the port drops a keyword the kernel does accept: not explained
])
def test_a_call_adapted_to_the_bound_kernel_is_a_kernel_adaptation(extended: bool, added_kernel_has: bool,
                                                                   severity: Severity) -> None:
    # upstream passes keywords the bound kernel lacks (out=, version=) and the port drops exactly those, adding one the
    # kernel takes (probs=) and one only the vendor build of a vendor-extends package may take (aux=)
    keywords = ("fa.varlen:+aux", "fa.varlen:+probs", "fa.varlen:-out", "fa.varlen:-version")
    hunk = Site("vllm_metax/x.py", 20, "f", "call-changed", "fa.varlen(+aux, +probs, -out, -version): upstream: ...",
                keywords=keywords if added_kernel_has else (*keywords, "fa.varlen:-window"))
    f = make_finding("MXA201", Location("vllm_metax/x.py", 20, "f"), "call-changed in f", [hunk_line(hunk)], sites=[hunk])
    call = CallSite(Location("vllm_metax/x.py", 20), "f", "fa.varlen", "fa.varlen", "external")
    params = tuple(ParamFact(n, "POSITIONAL_OR_KEYWORD") for n in ("q", "k", "probs", "window"))
    fact = CallableFact("fa.varlen", "ok", "static", "(q, k, probs=False, window=None)", params,
                        stand_in="public base fa==1.0 of fa==1.0+vendor", stand_in_extended=extended)
    (got,) = triage([f], [call], StackFacts("py", "t", "h", {"fa.varlen": fact}))
    assert got.severity is severity
    if severity is Severity.INFO:
        verdict = got.sites[0].verdict
        assert verdict.startswith("info: keyword(s) out, version dropped because the installed fa.varlen has no such parameter")
        assert "added probs, which it accepts" in verdict and "added aux, which only the vendor build may take" in verdict


# ---------------------------------------------------------------- one finding per root cause


def test_hunks_of_one_function_are_one_finding_with_a_line_each(tmp_path: Path) -> None:
    upstream = "def run(q, k):\n    a = kernel(q, scale=1)\n    b = 2\n    c = other(k, window=3)\n    return a, b, c\n\nX = run(1, 2)\n"
    port = "def run(q, k):\n    a = kernel(q, scale=5)\n    b = 2\n    c = other(k, window=4)\n    return a, b, c\n\nX = run(1, 2)\n"
    _, findings = run(tmp_path, upstream, port)
    f = only(findings, "MXA201")
    assert "2 undeclared differences in run" in f.message
    assert [e.split(" [")[0] for e in f.evidence if " [changed] " in e] == [f"vllm_metax/{REL}:2", f"vllm_metax/{REL}:4"]


def test_two_findings_of_one_call_are_one_finding_with_both_in_its_evidence() -> None:
    loc = "vllm_metax/fi.py"
    def lse(line: int, symbol: str, message: str, evidence: str) -> Finding:
        return Finding("MXA510", Category.LSE, Severity.ERROR, Location(loc, line, symbol), message, (evidence,))

    a = lse(327, "Wrapper.run:prefix_lse", "prefix_lse is base 2, merge expects base e", "producer a")
    b = lse(327, "Wrapper.run:suffix_lse", "suffix_lse is base 2, merge expects base e", "producer b")
    other = lse(400, "Wrapper.run:lse", "another call", "producer c")
    got = group_per_call([a, b, other])
    assert len(got) == 2
    merged = got[0]
    assert merged.severity is Severity.ERROR and merged.location.symbol == "Wrapper.run"
    assert merged.message.startswith("2 findings at one call: prefix_lse") and "suffix_lse" in merged.message
    assert "producer a" in merged.evidence and "producer b" in merged.evidence


def test_two_rules_about_one_parameter_of_one_call_are_one_finding() -> None:
    # The stack check (installed) and the binding check (upstream) both read an upstream op: one break.
    loc, symbol = "vllm_metax/triton_attn.py", "Impl.do_kv_cache_update:ops.reshape_quant:kv_quant_mode"
    stack = Finding("MXA103", Category.SIGNATURE, Severity.ERROR, Location(loc, 726, symbol),
                    "reshape_quant does not pass 'kv_quant_mode', required by installed ops.reshape_quant", ("installed",))
    binding = Finding("MXA109", Category.SIGNATURE, Severity.ERROR, Location(loc, 726, symbol),
                      "reshape_quant(...): required parameter 'kv_quant_mode' is not passed", ("upstream",))
    other_param = Finding("MXA109", Category.SIGNATURE, Severity.ERROR, Location(loc, 726, symbol[:-len("kv_quant_mode")] + "scale"),
                          "reshape_quant(...): required parameter 'scale' is not passed", ("upstream",))
    elsewhere = replace(binding, location=Location(loc, 800, symbol))
    got = group_per_call([stack, binding, other_param, elsewhere])
    assert [f.rule for f in got] == ["MXA103", "MXA109"]  # the binding check's other parameter joins its rule's group
    assert got[0].message.startswith("3 findings at one call: reshape_quant does not pass")
    assert "required parameter 'kv_quant_mode'" in got[0].message and "required parameter 'scale'" in got[0].message
    assert "installed" in got[0].evidence and "upstream" in got[0].evidence
    assert got[1] is elsewhere
    # without the shared symbol, two rules at one call stay two findings
    apart = group_per_call([stack, other_param])
    assert [f.rule for f in apart] == ["MXA103", "MXA109"] and apart[1] is other_param


def test_the_same_upstream_edit_missed_in_several_functions_is_one_drift_finding(tmp_path: Path) -> None:
    body = "    idx = convert_index(meta.req_id_per_token{}, topk_indices, block_size=64)\n    return kernel(idx)\n"
    base = "".join(f"def {n}(meta, topk_indices):\n" + body.format("") + "\n" for n in ("a", "b", "c"))
    upstream = "".join(f"def {n}(meta, topk_indices):\n" + body.format("[:topk_indices.shape[0]]") + "\n" for n in ("a", "b", "c"))
    _, findings = run(tmp_path, upstream, base + "X = a(1, 2), b(1, 2), c(1, 2)\n", base + "X = a(1, 2), b(1, 2), c(1, 2)\n")
    f = only(findings, "MXA203")
    assert "3 upstream changes not followed in 3 functions (a, b, c)" in f.message


def test_imports_from_one_kernel_package_are_one_finding(tmp_path: Path) -> None:
    upstream = "from vllm.third_party.mla import mla_decode, mla_meta\n\ndef f(q):\n    return mla_decode(mla_meta(q))\n\nX = f(1)\n"
    port = "import mla_vendor\nfrom mla_vendor.interface import mla_decode, mla_meta\n\ndef f(q):\n    return mla_decode(mla_meta(q))\n\nX = f(1)\n"
    _, findings = run(tmp_path, upstream, port)
    f = only(findings, "MXA201")
    assert sum(" [vendor-kernel-import] " in e for e in f.evidence) == 2 and f.severity is Severity.WARNING


def test_the_same_names_from_the_kernel_package_upstream_vendors_a_copy_of_are_info(tmp_path: Path) -> None:
    upstream = "from vllm.third_party.mla.mla_interface import mla_decode, mla_meta\n\ndef f(q):\n    return mla_decode(mla_meta(q))\n\nX = f(1)\n"
    port = "from mla_vendor.mla_interface import mla_decode, mla_meta\n\ndef f(q):\n    return mla_decode(mla_meta(q))\n\nX = f(1)\n"
    _, findings = run(tmp_path, upstream, port)
    f = only(findings, "MXA201")
    assert f.severity is Severity.INFO and "upstream vendors a copy of" in info_reason(f)


# ---------------------------------------------------------------- declarations, moves, aliases


DECLARED = {
    "fenced block": "def run(q):\n    # /---- Metax Modification ----\\\n    # vendor kernel wants scale 2\n    a = kernel(q, scale=2)\n    # \\---- Metax Modification ----/\n    return a\n",
    "marker line directly above": "def run(q):\n    # Metax Modification: vendor kernel wants scale 2\n    a = kernel(q, scale=2)\n    return a\n",
    "vendor comment directly above": "def run(q):\n    # the vendor kernel wants scale 2\n    a = kernel(q, scale=2)\n    return a\n",
    "trailing marker": "def run(q):\n    a = kernel(q, scale=2)  # [metax] vendor kernel wants scale 2\n    return a\n",
    "marker inside the statement": "def run(q):\n    a = kernel(\n        q,\n        # Metax: the vendor kernel wants scale 2\n        scale=2,\n    )\n    return a\n",
    "vendor-named note inside the statement": "def run(q):\n    a = kernel(\n        q,\n        # Note: maca's kernel wants scale 2\n        scale=2,\n    )\n    return a\n",
}


@pytest.mark.parametrize("port", DECLARED.values(), ids=DECLARED.keys())
def test_each_declaration_form_declares_the_change(tmp_path: Path, port: str) -> None:
    diffs, findings = run(tmp_path, "def run(q):\n    a = kernel(q, scale=1)\n    return a\n\nX = run(1)\n", port + "\nX = run(1)\n")
    assert [d.declared for d in diffs if d.kind == "call-changed" or d.kind == "changed"] == [True]
    assert not [f for f in findings if f.rule == "MXA201"]


NOT_DECLARED = {
    "commented-out argument": "def run(q):\n    a = kernel(\n        q,\n        # scale=1,\n    )\n    return a\n",
    "comment copied from upstream": "def run(q):\n    # upstream's own note\n    a = kernel(q, scale=2)\n    return a\n",
}


@pytest.mark.parametrize("port", NOT_DECLARED.values(), ids=NOT_DECLARED.keys())
def test_what_does_not_declare_a_change(tmp_path: Path, port: str) -> None:
    upstream = "def run(q):\n    # upstream's own note\n    a = kernel(q, scale=1)\n    return a\n\nX = run(1)\n"
    diffs, _ = run(tmp_path, upstream, port + "\nX = run(1)\n")
    assert [d.declared for d in diffs if d.kind not in {"cosmetic"}] == [False]


def test_statement_moved_within_its_function_is_not_dropped(tmp_path: Path) -> None:
    upstream = "def run(q, k):\n    a = prepare(q)\n    b = other(k)\n    c = third(k)\n    return kernel(a, b, c)\n\nX = run(1, 2)\n"
    port = "def run(q, k):\n    b = other(k)\n    c = third(k)\n    a = prepare(q)\n    return kernel(a, b, c)\n\nX = run(1, 2)\n"
    diffs, findings = run(tmp_path, upstream, port)
    assert [d.kind for d in diffs] == ["moved"] and "upstream line 2 is at port line 4" in diffs[0].detail
    assert only(findings, "MXA201").severity is Severity.INFO


def test_alias_of_the_same_upstream_object_is_not_a_port_definition(tmp_path: Path) -> None:
    upstream = "from vllm._custom_ops import reshape_cache\n\ndef f(q):\n    return reshape_cache(q)\n\nX = f(1)\n"
    port = "from vllm import _custom_ops as ops\n\nreshape_cache = ops.reshape_cache\n\ndef f(q):\n    return reshape_cache(q)\n\nX = f(1)\n"
    diffs, findings = run(tmp_path, upstream, port)
    assert not [f for f in findings if f.rule == "MXA201" and f.severity is Severity.WARNING]
    assert not [d for d in diffs if d.kind == "changed"]


def test_importing_upstreams_own_function_is_not_a_removal(tmp_path: Path) -> None:
    upstream = "def helper(q):\n    return q\n\ndef f(q):\n    return helper(q)\n\nX = f(1)\n"
    port = "from vllm.v1.attention.backends.demo import helper\n\ndef f(q):\n    return helper(q)\n\nX = f(1)\n"
    diffs, _ = run(tmp_path, upstream, port)
    assert not [d for d in diffs if d.kind == "removed"]


def test_a_check_finding_on_a_statement_upstream_also_has_is_labelled_inherited(tmp_path: Path) -> None:
    from metax_audit.stages.triage import Counterparts, label_inherited

    _write(tmp_path / "port", "vllm_metax/fi.py", "def f(q):\n    w = Wrapper(q, backend='auto')\n    v = Wrapper(q, mine=1)\n")
    _write(tmp_path / "up", "vllm/fi.py", "def f(q):\n    w = Wrapper(q,\n                backend='auto')\n")
    cp = Counterparts(tmp_path / "port", tmp_path / "up", "0.26.0", {"vllm_metax/fi.py": "vllm/fi.py"})
    inherited = Finding("MXA101", Category.SIGNATURE, Severity.ERROR, Location("vllm_metax/fi.py", 2, "f"), "Wrapper(..., backend=...)",
                        ("installed: Wrapper(q)",))
    own = Finding("MXA101", Category.SIGNATURE, Severity.ERROR, Location("vllm_metax/fi.py", 3, "f"), "Wrapper(..., mine=...)",
                  ("installed: Wrapper(q)",))
    got = label_inherited([inherited, own], cp)
    assert got[0].evidence[-1] == "attribution: inherited from upstream 0.26.0, also present there (vllm/fi.py:2)"
    assert got[1].evidence == own.evidence


def test_signature_change_every_port_caller_binds_to_is_info(tmp_path: Path) -> None:
    upstream = "def plan(self, indptr, head_dim, page_size=16):\n    return kernel(indptr, head_dim)\n\nX = plan(w, 1, 2)\n"
    port = ("def plan(self, indptr, seq_lens, head_dim, page_size=16):\n    return kernel(indptr, head_dim)\n\n"
            "X = plan(w, indptr=1, seq_lens=3, head_dim=2)\n")
    _, findings = run(tmp_path, upstream, port)
    f = next(f for f in findings if f.location.symbol == "plan")
    assert f.severity is Severity.INFO and "every port call of plan (1) binds to the port's signature" in info_reason(f)
    # A caller that still follows the old signature keeps it a warning.
    _, findings = run(tmp_path / "old", upstream, port.replace("X = plan(w, indptr=1, seq_lens=3, head_dim=2)", "X = plan(w, 1, 2)"))
    assert next(f for f in findings if f.location.symbol == "plan").severity is Severity.WARNING


def test_a_local_variable_choosing_the_kernel_is_not_a_field(tmp_path: Path) -> None:
    upstream = "def fwd(kv, q):\n    return gather_cache(kv, q)\n\nX = fwd(1, 2)\n"
    port = "def fwd(kv, q):\n    gather = gather_cache if q else plain_gather_cache\n    return gather(kv, q)\n\nX = fwd(1, 2)\n"
    _, findings = run(tmp_path, upstream, port)
    assert next(f for f in findings if f.location.symbol == "fwd").severity is Severity.WARNING


def test_a_branch_for_a_kv_cache_dtype_the_port_does_not_support_never_runs(tmp_path: Path) -> None:
    upstream = ("class Backend:\n    supported_kv_cache_dtypes = ['auto', 'fp8']\n\n"
                "def fwd(q, kv_cache_dtype):\n    if kv_cache_dtype.startswith('fp8'):\n        q = quant(q, scale=1)\n    return kernel(q)\n\nX = fwd(1, 2)\n")
    port = upstream.replace("['auto', 'fp8']", "['auto', 'bfloat16']").replace("scale=1", "scale=2")
    _, findings = run(tmp_path, upstream, port)
    f = next(f for f in findings if f.location.symbol == "fwd")
    assert f.severity is Severity.INFO
    assert "supported_kv_cache_dtypes (auto, bfloat16)" in info_reason(f) and "exclude fp8*" in info_reason(f)


def test_the_cache_key_of_a_comparison_covers_the_platform_and_callers_in_other_files(tmp_path: Path) -> None:
    from metax_audit.stages.compare import compare_dependencies

    root = tmp_path / "port"
    _write(root, f"vllm_metax/{REL}", "def _dequant(kv):\n    return kv\n")
    _write(root, "vllm_metax/platform.py", PLATFORM)
    _write(root, "vllm_metax/other.py", "x = 1\n")
    config = AuditConfig()
    first = compare_dependencies(root, config, [f"vllm_metax/{REL}"])
    _write(root, "vllm_metax/other.py", "x = 1\n")
    assert compare_dependencies(root, config, [f"vllm_metax/{REL}"]) == first
    _write(root, "vllm_metax/other.py", "from .v1.attention.backends.demo import _dequant\n")  # now it is called
    second = compare_dependencies(root, config, [f"vllm_metax/{REL}"])
    assert second != first
    _write(root, "vllm_metax/platform.py", PLATFORM.replace("return False", "return True"))
    third = compare_dependencies(root, config, [f"vllm_metax/{REL}"])
    assert third != second
    # A port module the file imports a function from: its constant answer decides branches of the file.
    _write(root, "vllm_metax/fa_utils.py", FA_UTILS)
    _write(root, f"vllm_metax/{REL}", "from vllm_metax.fa_utils import get_flash_attn_version\n\ndef _dequant(kv):\n    return kv\n")
    fourth = compare_dependencies(root, config, [f"vllm_metax/{REL}"])
    _write(root, "vllm_metax/fa_utils.py", FA_UTILS.replace("return 2", "return 3"))
    assert compare_dependencies(root, config, [f"vllm_metax/{REL}"]) != fourth


def test_a_difference_at_the_line_of_an_error_joins_the_error_as_its_root_cause() -> None:
    from metax_audit.stages.triage import merge_into_errors

    error = Finding("MXA105", Category.SIGNATURE, Severity.ERROR, Location("vllm_metax/x.py", 912, "f"),
                    "positional lands on batch_size", ("installed: op(a, b)",))
    drift = Finding("MXA203", Category.UPSTREAM_DRIFT, Severity.WARNING, Location("vllm_metax/x.py", 851, "f"), "2 upstream changes",
                    (f"vllm_metax/x.py:851 [upstream-not-followed] a {KERNEL_LINE}", f"vllm_metax/x.py:912 [upstream-not-followed] b {KERNEL_LINE}"),
                    sites=(Site("vllm_metax/x.py", 851, "f", "upstream-not-followed", "a"), Site("vllm_metax/x.py", 912, "f", "upstream-not-followed", "b")))
    other = Finding("MXA201", Category.UNDECLARED_DIFFERENCE, Severity.WARNING, Location("vllm_metax/x.py", 5, "g"), "elsewhere",
                    (f"vllm_metax/x.py:5 [changed] c {KERNEL_LINE}",), sites=(Site("vllm_metax/x.py", 5, "g", "changed", "c"),))
    got = merge_into_errors([error, drift, other])
    assert [f.rule for f in got] == ["MXA105", "MXA201"]
    assert got[0].severity is Severity.ERROR and "root cause, also MXA203: 2 upstream changes" in got[0].evidence
    assert drift.evidence[1] in got[0].evidence
    assert ("vllm_metax/x.py", 851) in {(x.path, x.line) for x in got[0].sites}  # the joined hunks stay sites of the error


KERNEL_LINE = "-- may change what a kernel computes or whether it runs"


# ---------------------------------------------------------------- removed code whose consequence is known

GUARDED = """\
def build(cfg, layers):
    params = get_params(cfg, layers)
    if {test}:
        raise NotImplementedError("this combination crashes")
    return infer(params)

X = build(1, 2)
"""
UNGUARDED = "def build(cfg, layers):\n    params = get_params(cfg, layers)\n    return infer(params)\n\nX = build(1, 2)\n"


def test_a_removed_guard_that_only_rejects_on_an_nvidia_capability_is_info(tmp_path: Path) -> None:
    upstream = GUARDED.format(test="current_platform.is_device_capability(90) and any(p.window_left != -1 for p in params)")
    _, findings = run(tmp_path, upstream, UNGUARDED)
    f = only(findings, "MXA202")
    assert f.severity is Severity.INFO, f.evidence
    assert "removed guard that only rejects on an NVIDIA capability" in info_reason(f)
    assert "raises NotImplementedError only when the device reports that NVIDIA architecture (current_platform.is_device_capability(90))" \
        in info_reason(f)


@pytest.mark.parametrize("test", [
    "any(p.window_left != -1 for p in params) and cfg.kv_cache_dtype == 'fp8'",  # rejects a dtype on every device
    "not current_platform.has_device_capability(90) and cfg.head_size > 256",  # a floor: older devices, MACA included
], ids=["dtype-on-every-device", "capability-floor"])
def test_a_removed_guard_that_rejects_on_every_device_stays_a_warning(tmp_path: Path, test: str) -> None:
    _, findings = run(tmp_path, GUARDED.format(test=test), UNGUARDED)
    relevant = [f for f in findings if f.rule in {"MXA201", "MXA202"} and f.location.symbol == "build"]
    assert relevant and all(f.severity is Severity.WARNING for f in relevant)
    assert not any("NVIDIA capability" in info_reason(f) for f in relevant)


def test_removed_statements_that_only_write_a_log_line_are_info(tmp_path: Path) -> None:
    upstream = ("def build(q):\n    capability = current_platform.get_device_capability()\n"
                "    arch = f'sm{capability.major}' if capability else 'unknown'\n    logger.info_once('arch=%s', arch)\n"
                "    return kernel(q)\n\nX = build(1)\n")
    port = "def build(q):\n    return kernel(q)\n\nX = build(1)\n"
    _, findings = run(tmp_path, upstream, port)
    f = only(findings, "MXA202")
    assert f.severity is Severity.INFO and "the removed statements only write a log line" in info_reason(f)
    # When a name the removed statements set is read later, they do more than feed the log.
    _, findings = run(tmp_path / "used", upstream.replace("return kernel(q)", "return kernel(q, arch)"), port)
    assert only(findings, "MXA202").severity is Severity.WARNING


FA_UTILS = "def get_flash_attn_version(requires_alibi=False, head_size=None):\n    logger.info_once('only version 2')\n    return 2\n"
VERSIONED = """\
from vllm_metax.v1.attention.backends.fa_utils import get_flash_attn_version


class Impl:
    def __init__(self, head_size):
        self.fa_version = get_flash_attn_version(head_size=head_size)

    def forward(self, q, ranges):
        mask = None
        if ranges is not None and self.fa_version == 4:
            mask = make_mask(ranges, window=q.shape[1])
        return kernel(q, mask=mask)
"""


def test_a_branch_under_a_value_the_port_fixes_never_runs(tmp_path: Path) -> None:
    port = VERSIONED.replace("        if ranges is not None and self.fa_version == 4:\n            mask = make_mask(ranges, window=q.shape[1])\n", "")
    _, findings = run(tmp_path, VERSIONED, port, extra_port={"v1/attention/backends/fa_utils.py": FA_UTILS})
    f = next(f for f in findings if f.location.symbol == "Impl.forward")
    assert f.severity is Severity.INFO, f.evidence
    assert "self.fa_version is 2 on the port" in info_reason(f)
    assert "fa_utils.py:1 get_flash_attn_version() returns 2" in info_reason(f)
    # A version the port computes is not fixed: the dropped branch may run.
    computed = FA_UTILS.replace("return 2", "return 4 if head_size else 2")
    _, findings = run(tmp_path / "computed", VERSIONED, port, extra_port={"v1/attention/backends/fa_utils.py": computed})
    assert next(f for f in findings if f.location.symbol == "Impl.forward").severity is Severity.WARNING


def test_a_removed_local_only_passed_as_a_keyword_the_installed_kernel_lacks_is_info(tmp_path: Path) -> None:
    upstream = ("def fwd(q, meta):\n    seqused_k = meta.seq_lens\n    q = q.contiguous()\n"
                "    return flash_attn_varlen_func(q, seqused_k=seqused_k)\n\nX = fwd(1, 2)\n")
    port = "def fwd(q, meta):\n    q = q.contiguous()\n    return flash_attn_varlen_func(q, cu_seqlens_k=meta.cu)\n\nX = fwd(1, 2)\n"
    _, findings = run(tmp_path, upstream, port)
    f = next(f for f in findings if f.location.symbol == "fwd" and any("[removed]" in e for e in f.evidence))
    assert any("port drops (read only as flash_attn_varlen_func(seqused_k=)): seqused_k = meta.seq_lens" in e for e in f.evidence)
    call = CallSite(Location(f.location.path, 3), "fwd", "flash_attn_varlen_func", "flash_attn.flash_attn_varlen_func", "external")
    params = (ParamFact("q", "POSITIONAL_OR_KEYWORD"), ParamFact("cu_seqlens_k", "POSITIONAL_OR_KEYWORD"))
    facts = StackFacts("py", "t", "h", {"flash_attn.flash_attn_varlen_func": CallableFact(
        "flash_attn.flash_attn_varlen_func", "ok", "static", "(q, cu_seqlens_k)", params)})
    removed = replace_evidence(f, [e for e in f.evidence if "[removed]" in e or not e.startswith("vllm_metax/")])
    (got,) = triage([removed], [call], facts)
    assert got.severity is Severity.INFO
    assert ("it only fed flash_attn_varlen_func(seqused_k=), and the installed flash_attn.flash_attn_varlen_func has no parameter "
            "'seqused_k'") in info_reason(got)
    # The installed kernel takes seqused_k: dropping what fed it may change the result.
    with_kw = StackFacts("py", "t", "h", {"flash_attn.flash_attn_varlen_func": CallableFact(
        "flash_attn.flash_attn_varlen_func", "ok", "static", "(...)", (*params, ParamFact("seqused_k", "KEYWORD_ONLY", "None")))})
    assert triage([removed], [call], with_kw)[0].severity is Severity.WARNING


def replace_evidence(f: Finding, evidence: list[str]) -> Finding:
    from dataclasses import replace

    return replace(f, evidence=tuple(evidence))


def test_a_grouped_finding_leads_with_its_most_consequential_hunk(tmp_path: Path) -> None:
    upstream = ("def fwd(q, meta):\n    q = q.contiguous()\n    out = flash_attn_varlen_func(q, out=meta.out, num_splits=meta.n)\n"
                "    return out\n\nX = fwd(1, 2)\n")
    port = ("def fwd(q, meta):\n    window = meta.sliding_window\n    q = q.contiguous()\n"
            "    out = flash_attn_varlen_func(q, window_size=window)\n    return out\n\nX = fwd(1, 2)\n")
    _, findings = run(tmp_path, upstream, port)
    f = next(f for f in findings if f.location.symbol == "fwd")
    assert f.severity is Severity.WARNING
    assert "2 undeclared differences in fwd; at line 4: call-changed: flash_attn_varlen_func(" in f.message, f.message
    assert f.location.line == 4
    hunks = [e.split(" [")[1].split("]")[0] for e in f.evidence if e.startswith("vllm_metax/")]
    assert hunks == ["call-changed", "added"]  # the lead first, then the others in line order


def test_hunk_kinds_rank_kernel_calls_first() -> None:
    from metax_audit.stages.compare.consequence import lead_rank

    hunks = [("added", "port adds: window = meta.sliding_window"),
             ("changed", "differs at ...dtype [upstream: fp8 | port: int8]; upstream: use_fp8 = dtype == 'fp8'"),
             ("argument-commented-out", "argument(s) wrapper.plan:fixed_split_size commented out"),
             ("removed", "port drops: attn_metadata.cascade_wrapper.plan(qo_indptr, kv_indptr)"),
             ("removed", "port drops: seqused_k = attn_metadata.seq_lens"),
             ("feature-disabled", "early return added: if cache_dtype == torch.bfloat16: return q")]
    ranked = sorted(hunks, key=lambda h: lead_rank(*h))
    assert ranked == [hunks[3], hunks[2], hunks[5], hunks[1], hunks[4], hunks[0]]


def test_an_upstream_argument_to_a_port_function_that_answers_a_constant_is_info(tmp_path: Path) -> None:
    base = VERSIONED
    upstream = VERSIONED.replace("get_flash_attn_version(head_size=head_size)", "get_flash_attn_version(head_size=head_size, head_size_v=head_size)")
    _, findings = run(tmp_path, upstream, base, base, extra_port={"v1/attention/backends/fa_utils.py": FA_UTILS})
    f = next(f for f in findings if f.location.symbol == "Impl.__init__")
    assert f.severity is Severity.INFO, f.evidence
    assert "the argument cannot change the answer: vllm_metax/v1/attention/backends/fa_utils.py:1 get_flash_attn_version() returns 2" \
        in info_reason(f)
    # When the port's function computes its answer, the argument upstream now passes may change it.
    computed = FA_UTILS.replace("return 2", "return 4 if head_size else 2")
    _, findings = run(tmp_path / "computed", upstream, base, base, extra_port={"v1/attention/backends/fa_utils.py": computed})
    assert next(f for f in findings if f.location.symbol == "Impl.__init__").severity is Severity.WARNING


def test_a_flow_finding_at_a_merge_call_upstream_also_has_is_labelled_inherited(tmp_path: Path) -> None:
    from metax_audit.stages.triage import Counterparts, label_inherited

    _write(tmp_path / "port", "vllm_metax/fi.py", "def run(a, b):\n    merge_attn_states(out, a.o, a.lse, b.o, b.lse)\n")
    _write(tmp_path / "up", "vllm/fi.py", "def run(a, b):\n    merge_attn_states(out, a.o, a.lse,\n        b.o, b.lse)\n")
    cp = Counterparts(tmp_path / "port", tmp_path / "up", "0.26.0", {"vllm_metax/fi.py": "vllm/fi.py"})
    flow = Finding("MXA510", Category.LSE, Severity.ERROR, Location("vllm_metax/fi.py", 2, "run"), "base-2 LSE into a base-e merge",
                   ("producer: fi.py:1",))
    [got] = label_inherited([flow], cp)
    assert got.evidence[-1] == ("attribution: inherited from upstream 0.26.0, the call where it breaks is also present there "
                                "(vllm/fi.py:2)")
    other = replace(flow, category=Category.COVERAGE, rule="MXA002")
    assert label_inherited([other], cp)[0].evidence == other.evidence


@pytest.mark.parametrize("text", ["x = 1\nif CAPABILITY >= 90:  # Hopper\n    pass\n", "a\nsm_90a\nSM90\nBlackWell\n",
                                  "nothing here\n", "k = 'ſm_90'\n", "# capabılity\nsm_1\n", "İ\nhopper\n", "中文 Hopper\nsm_80\n"])
def test_arch_lines_are_the_case_blind_pattern_lines(text: str) -> None:
    from metax_audit.stages.compare.load import _arch_lines, _match_lines
    from metax_audit.stages.compare.rules import _ARCH_TEXT

    assert _arch_lines(text) == _match_lines(text, _ARCH_TEXT)
