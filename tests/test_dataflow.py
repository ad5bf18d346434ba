# Dataflow of LSE values from producing kernels to merges: mismatches found, conversions and
# matching flags accepted, transposes recognised, unfollowable values reported (synthetic port).
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from metax_audit.core.contracts import Contracts, parse_contracts
from metax_audit.core.models import Category
from metax_audit.stages.checks.lse import check_dataflow

CONTRACTS = '''
```yaml
convention:
  component: "fakeinfer.*.PagedWrapper.run"
  role: producer
  lse_base: "2"
  flag: {name: return_lse, default: false, when_true: lse, when_false: no-lse}
  lse_layout: "[tokens, heads]"
  lse_result: 1
  lse_out_param: lse
  probe: {family: paged-decode, target: "fakeinfer:PagedWrapper"}
```

```yaml
convention:
  component: "fakeattn.varlen"
  role: producer
  lse_base: "e"
  flag: {name: return_attn_probs, aliases: [return_softmax_lse], default: false, when_true: lse, when_false: no-lse}
  lse_layout: "[heads, tokens]"
  lse_result: 1
```

```yaml
convention:
  component: "*.merge_attn_states"
  role: consumer
  lse_base: "e"
  lse_layout: "[heads, tokens]"
  lse_params: {prefix_lse: 2, suffix_lse: 4}
  probe: {family: merge-states, target: "fakeops:merge_attn_states"}
```

```yaml
convention:
  component: "*.dcp_reduce"
  role: consumer
  lse_base: param-dependent
  flag: {name: is_lse_base_on_e, default: true, when_true: "e", when_false: "2"}
  lse_layout: "[tokens, heads]"
  lse_params: {lse: 1}
  returns_lse: {flag: return_lse, index: 1}
```
'''

HEADER = """
import math
from functools import partial
from fakeinfer import PagedWrapper
from fakeattn import varlen
from fakeops import merge_attn_states, dcp_reduce
"""


@pytest.fixture
def contracts() -> Contracts:
    return parse_contracts(CONTRACTS, "contracts.md")


def _run(tmp_path: Path, contracts: Contracts, body: str, extra: dict[str, str] | None = None):
    files = {"port/backend.py": HEADER + textwrap.dedent(body), **(extra or {})}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return check_dataflow(tmp_path, sorted(files), contracts, port_package="port")


def test_base2_producer_into_base_e_merge_is_a_finding(tmp_path, contracts):
    flows, findings, unresolved = _run(tmp_path, contracts, """
    class Impl:
        def __init__(self):
            self._wrapper = PagedWrapper(None, "NHD")

        def forward(self, q, kv, out, q2, k, v):
            o1, lse1 = self._wrapper.run(q, kv, return_lse=True)
            lse1 = lse1.transpose(0, 1).contiguous()
            o2, lse2, _ = varlen(q2, k, v, return_attn_probs=True)
            merge_attn_states(out, o1, lse1, o2, lse2)
    """)
    by_arg = {f.consumer.arg: f for f in flows}
    assert by_arg["prefix_lse"].verdict == "mismatch"
    assert by_arg["prefix_lse"].producer.callee == "fakeinfer.PagedWrapper.run"
    assert by_arg["suffix_lse"].verdict == "match"
    assert [f.category for f in findings] == [Category.LSE]
    ev = "\n".join(findings[0].evidence)
    src = (tmp_path / "port/backend.py").read_text().splitlines()
    run_line = next(i for i, t in enumerate(src, 1) if "self._wrapper.run" in t)
    merge_line = next(i for i, t in enumerate(src, 1) if "merge_attn_states(out" in t)
    assert f"port/backend.py:{run_line}" in ev and f"port/backend.py:{run_line + 1}" in ev
    assert "transpose" in ev and "--probes dcp,lse" in ev
    assert findings[0].location.path == "port/backend.py" and findings[0].location.line == merge_line
    assert unresolved == []


@pytest.mark.parametrize(
    "conversion",
    ["lse1 = lse1 * math.log(2)", "lse1 = lse1 / math.log2(math.e)", "lse1 = LN2 * lse1", "lse1 = lse1 * 0.6931471805599453",
     "lse1 = torch.log(torch.exp2(lse1))"],
)
def test_correct_conversion_is_not_flagged(tmp_path, contracts, conversion):
    flows, findings, _ = _run(tmp_path, contracts, f"""
    import torch
    LN2 = math.log(2.0)

    def forward(q, kv, out, o2, lse2):
        w = PagedWrapper(None, "NHD")
        o1, lse1 = w.run(q, kv, return_lse=True)
        {conversion}
        merge_attn_states(out, o1, lse1.T, o2, lse2)
    """)
    (flow,) = flows
    assert flow.verdict == "match", flow.reasons
    assert findings == []


def test_wrong_direction_conversion_is_flagged(tmp_path, contracts):
    flows, findings, _ = _run(tmp_path, contracts, """
    def forward(q, kv, out, o2, lse2):
        w = PagedWrapper(None, "NHD")
        o1, lse1 = w.run(q, kv, return_lse=True)
        merge_attn_states(out, o1, (lse1 * 1.4426950408889634).T, o2, lse2)
    """)
    # Multiplying a base-2 LSE by log2(e) gives neither base: not a pass, and said so.
    assert flows[0].verdict == "unknown" and findings == []
    assert "base: value ?" in flows[0].reasons[0]


def test_transpose_fixes_layout_and_its_absence_is_a_layout_finding(tmp_path, contracts):
    flows, findings, _ = _run(tmp_path, contracts, """
    def good(q, k, v, out, o2, lse2):
        o1, lse1, _ = varlen(q, k, v, return_attn_probs=True)
        o, red = dcp_reduce(o1, lse1.transpose(0, 1), None, return_lse=True)
        merge_attn_states(out, o, red.permute(1, 0), o2, lse2)

    def bad(q, k, v, out, o2, lse2):
        o1, lse1, _ = varlen(q, k, v, return_softmax_lse=True)
        o, red = dcp_reduce(o1, lse1, None, return_lse=True)
        merge_attn_states(out, o, red, o2, lse2)
    """)
    good = [f for f in flows if f.consumer.location.symbol == "good"]
    bad = [f for f in flows if f.consumer.location.symbol == "bad"]
    assert {f.verdict for f in good} == {"match"}
    assert len(good) == 2  # into the reduction, then through it into the merge
    assert {f.verdict for f in bad} == {"mismatch"}
    assert {f.category for f in findings} == {Category.LAYOUT}
    through = next(f for f in good if f.consumer.callee.endswith("merge_attn_states"))
    assert [s.layout for s in through.steps][-1] == "[heads, tokens]"


def test_partial_bound_flag_decides_the_reduction_base(tmp_path, contracts):
    flows, findings, _ = _run(tmp_path, contracts, """
    class Impl:
        def __init__(self, a2a):
            self._wrapper = PagedWrapper(None, "HND")
            self.combine_ok = partial(dcp_reduce, is_lse_base_on_e=False)
            self.combine_bad = dcp_reduce

        def decode(self, q, kv, out):
            lse = torch.empty(3, 4)
            self._wrapper.run(q, kv, out=out, lse=lse, return_lse=True)
            a = self.combine_ok(out, lse, None)
            b = self.combine_bad(out, lse, None)
    """)
    verdicts = {f.consumer.location.line: f.verdict for f in flows}
    assert sorted(verdicts.values()) == ["match", "mismatch"]
    (finding,) = findings
    assert "is_lse_base_on_e not passed" in " ".join(finding.evidence)


def test_flag_off_means_no_lse_and_branches_are_joined(tmp_path, contracts):
    flows, _, _ = _run(tmp_path, contracts, """
    def f(q, k, v, kv, out, o2, lse2, flag):
        if flag:
            o1, lse1, _ = varlen(q, k, v, return_attn_probs=True)
        else:
            o1, lse1 = PagedWrapper(None).run(q, kv, return_lse=True)
            lse1 = lse1.t()
        merge_attn_states(out, o1, lse1, o2, lse2)
        o3 = varlen(q, k, v)
    """)
    assert sorted(f.verdict for f in flows) == ["match", "mismatch"]


def test_helper_returning_an_lse_is_followed(tmp_path, contracts):
    helper = """
def run_context(attn_fn, q, k, v):
    buf = torch.full((4, 8), float("-inf"))
    o, part, _ = attn_fn(q, k, v, return_attn_probs=True)
    buf[:, :4] = part
    return o, buf
"""
    flows, _, _ = _run(tmp_path, contracts, """
    import torch
    from port.helpers import run_context

    def forward(q, k, v, out, o2, lse2):
        o1, lse1 = run_context(varlen, q, k, v)
        merge_attn_states(out, o1, lse1, o2, lse2)
    """, {"port/helpers.py": "import torch\n" + helper})
    (flow,) = flows
    assert flow.verdict == "match"
    assert flow.producer.location.path == "port/helpers.py"
    assert any("returned by run_context" in s.text for s in flow.steps)


def test_unfollowable_values_are_unresolved(tmp_path, contracts):
    flows, findings, unresolved = _run(tmp_path, contracts, """
    class Impl:
        def forward(self, q, kv, out, o2, lse2, holder):
            w = PagedWrapper(None)
            o1, lse1 = w.run(q, kv, return_lse=True)
            holder.append(lse1)
            self.saved = lse1
            o3, lse3 = self.impl.forward_mqa(q, kv)
            merge_attn_states(out, o3, lse3, o2, lse2)
    """)
    assert flows == [] and findings == []
    reasons = " | ".join(u.reason for u in unresolved)
    assert "container" in reasons and "attribute" in reasons and "not traced to a producing kernel" in reasons
    assert all(u.location.path == "port/backend.py" and u.location.line > 0 for u in unresolved)


def test_unparsable_file_is_unresolved_not_dropped(tmp_path, contracts):
    _, _, unresolved = _run(tmp_path, contracts, "def broken(:\n")
    assert unresolved and "could not be parsed" in unresolved[0].reason


def test_loop_carried_merge_output(tmp_path, contracts):
    flows, findings, unresolved = _run(tmp_path, contracts, """
    def chunks(q, k, v, n):
        acc = None
        for i in range(n):
            o, lse, _ = varlen(q, k, v, return_attn_probs=True)
            if acc is None:
                acc, acc_lse = o, lse
            else:
                merge_attn_states(acc, acc, acc_lse, o, lse)
        return acc
    """)
    assert {f.consumer.arg for f in flows} == {"prefix_lse", "suffix_lse"}
    assert findings == [] and unresolved == []


def test_unpacking_an_lse_the_call_did_not_ask_for(tmp_path, contracts):
    flows, findings, _ = _run(tmp_path, contracts, """
    def cascade(q, k, v, out):
        p_out, p_lse, _ = varlen(q, k, v)
        s_out, s_lse, _ = varlen(q, k, v, return_attn_probs=True)
        merge_attn_states(out, p_out, p_lse, s_out, s_lse)
    """)
    assert [f.rule for f in findings] == ["MXA512"]
    assert "return_attn_probs not passed" in findings[0].message and "p_lse" in findings[0].location.symbol
    assert [f.consumer.arg for f in flows] == ["suffix_lse"]


def test_runtime_bound_method_variants_and_annotated_wrappers(tmp_path, contracts):
    # A method chosen at __init__ (`self._chunk = self._chunk_fi`) and a wrapper known only from
    # a dataclass annotation (quoted, as a list) reached through metadata: both are followed.
    flows, findings, _ = _run(tmp_path, contracts, """
    from dataclasses import dataclass, field

    @dataclass
    class PrefillMeta:
        chunks: "list[PagedWrapper]" = field(default_factory=list)

    class Impl:
        def __init__(self, use_fi):
            if use_fi:
                self._chunk = self._chunk_fi
            else:
                self._chunk = self._chunk_fa

        def _chunk_fi(self, meta, i, q, kv):
            out, lse = meta.chunks[i].run(q, kv, return_lse=True)
            if lse is None:
                return out, None
            return out, lse.transpose(0, 1).contiguous()

        def _chunk_fa(self, meta, i, q, k, v):
            out, lse, _ = varlen(q, k, v, return_attn_probs=True)
            return out, lse

        def forward(self, meta, q, kv, out, o2, lse2):
            o1, lse1 = self._chunk(meta, 0, q, kv)
            merge_attn_states(out, o1, lse1, o2, lse2)
    """)
    verdicts = sorted((f.producer.callee.rsplit(".", 2)[-2], f.verdict) for f in flows if f.consumer.location.symbol == "Impl.forward")
    assert verdicts == [("PagedWrapper", "mismatch"), ("fakeattn", "match")]
    (finding,) = findings
    assert any("returned by Impl._chunk_fi" in e for e in finding.evidence)


SCALE_CONTRACTS = CONTRACTS + '''
```yaml
convention:
  component: "*.cache_insert"
  role: consumer
  lse_base: "none"
  scale_params: {k_scale: {position: 3, form: tensor}, v_scale: {position: 4, form: tensor}}
```
'''


def test_scale_form_and_swapped_scales(tmp_path):
    c = parse_contracts(SCALE_CONTRACTS.replace(
        "  lse_out_param: lse\n  probe: {family: paged-decode",
        "  lse_out_param: lse\n  scale_params: {k_scale: {form: float}, v_scale: {form: float}}\n  probe: {family: paged-decode"))
    _, findings, _ = _run(tmp_path, c, """
    from fakeops import cache_insert

    class Impl:
        def __init__(self):
            self.w = PagedWrapper(None)

        def ok(self, layer, q, kv, k, v, slots):
            cache_insert(k, v, slots, layer._k_scale, layer._v_scale)
            self.w.run(q, kv, k_scale=layer._k_scale_float, v_scale=layer._v_scale_float)
            cache_insert(k, v, slots, layer._k_scale, layer._k_scale)  # one shared scale (MLA): fine

        def bad(self, layer, q, kv, k, v, slots):
            cache_insert(k, v, slots, layer._k_scale_float, layer._v_scale)
            self.w.run(q, kv, k_scale=layer._v_scale_float, v_scale=layer._k_scale_float)
            self.w.run(q, kv, k_scale=layer._k_scale, v_scale=1.0)
    """)
    got = sorted((f.rule, f.location.symbol) for f in findings)
    assert got == [
        ("MXA513", "Impl.bad:k_scale"),  # a float into the cache op
        ("MXA513", "Impl.bad:k_scale"),  # a tensor into the FlashInfer wrapper
        ("MXA514", "Impl.bad:k_scale"),  # swapped
    ]
    assert all(f.category is Category.FP8_SCALE for f in findings)


def test_dynamic_dispatch_and_positional_out_buffer(tmp_path):
    # `self.impl.decode(...)` picks an impl class at run time: every port class defining the
    # method is a candidate; one writes the LSE into a buffer passed by position.
    c = parse_contracts(CONTRACTS + '''
```yaml
convention:
  component: "*.triton_decode"
  role: producer
  lse_base: "e"
  lse_layout: "[tokens, heads]"
  lse_out_param: lse
  lse_out_position: 2
```
''')
    flows, findings, unresolved = _run(tmp_path, c, """
    import torch
    from fakeops import triton_decode

    class TritonImpl:
        def mqa_decode(self, q, kv):
            lse = torch.empty(4, 8)
            o = torch.empty_like(q)
            triton_decode(q, kv, lse, o)
            return o, lse

    class InferImpl:
        def mqa_decode(self, q, kv):
            return PagedWrapper(None).run(q, kv, return_lse=True)

    class Layer:
        def forward(self, q, kv):
            o, lse = self.impl.mqa_decode(q, kv)
            return dcp_reduce(o, lse, None)
    """)
    got = sorted((f.producer.callee.rsplit(".", 1)[-1], f.verdict) for f in flows)
    assert got == [("run", "mismatch"), ("triton_decode", "match")]
    assert all(f.producer.via in ("import", "constructor") for f in flows)
    assert unresolved == [] and [f.rule for f in findings] == ["MXA510"]


def test_an_expression_too_deep_to_walk_is_coverage_not_a_crash(tmp_path, contracts, monkeypatch):
    """A statement nesting deeper than the walk follows is recorded as not analysed (MXA002,
    coverage) and the walk goes on to find the real flow. (The bound is lowered here to keep the
    input small; the 500-term case is the next test.)"""
    from metax_audit.stages.dataflow import walker

    monkeypatch.setattr(walker, "MAX_EXPR_DEPTH", 20)
    deep = " + ".join(["'a'"] * 50)
    flows, findings, unresolved = _run(tmp_path, contracts, f"""
    class Impl:
        def __init__(self):
            self._wrapper = PagedWrapper(None, "NHD")

        def forward(self, q, kv, out, o2, lse2):
            o1, lse1 = self._wrapper.run(q, kv, return_lse=True)
            banner = {deep}
            merge_attn_states(out, o1, lse1, o2, lse2)
    """)
    src = (tmp_path / "port/backend.py").read_text().splitlines()
    deep_line = next(i for i, t in enumerate(src, 1) if "banner =" in t)
    assert [f.verdict for f in flows if f.consumer.arg == "prefix_lse"] == ["mismatch"]
    (coverage,) = [f for f in findings if f.category is Category.COVERAGE]
    assert coverage.rule == "MXA002" and coverage.severity.value == "info"
    assert f"expression too deep to analyse at port/backend.py:{deep_line}" in coverage.message
    assert any(u.location.line == deep_line and "too deep" in u.reason for u in unresolved)


def test_a_500_term_expression_is_coverage_not_a_crash(tmp_path, contracts):
    """At the parse's bound: the file is parsed and the expression cut below 100 levels
    (pysource.prune_deep), so the review reports the statement once, as discover's MXA002
    "expression too deep to analyse"; the walk meets the cut, and says nothing more about it."""
    from metax_audit.core.pysource import cached_parse, too_deep_lines

    deep = " + ".join(["'a'"] * 500)
    flows, findings, _ = _run(tmp_path, contracts, f"""
    def forward(lse):
        banner = {deep}
        return lse
    """)
    assert flows == [] and findings == []
    src = (tmp_path / "port/backend.py").read_text().splitlines()
    assert too_deep_lines(cached_parse(tmp_path / "port/backend.py")[1]) == (next(i for i, t in enumerate(src, 1) if "banner =" in t),)


def test_a_layout_mismatch_with_an_unknown_base_is_a_layout_finding(tmp_path, contracts):
    """The rule follows what the flow gets wrong (typed), not the words its reasons start with: an
    unknown base (scaled by a runtime value) plus a transposed layout is MXA511, not MXA510."""
    _, findings, _ = _run(tmp_path, contracts, """
    class Impl:
        def __init__(self):
            self._wrapper = PagedWrapper(None, "NHD")

        def forward(self, q, kv, out, o2, lse2, factor):
            o1, lse1 = self._wrapper.run(q, kv, return_lse=True)
            lse1 = lse1 * factor
            merge_attn_states(out, o1, lse1, o2, lse2)
    """)
    (f,) = findings
    assert f.rule == "MXA511" and any(e.startswith("base: value ?") for e in f.evidence)
