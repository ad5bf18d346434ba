"""MXA213: a port call standing where upstream's call stands leaves out a keyword that upstream's call and the
port's own other calls of the same kernel pass (vllm_metax v0.17.0-v0.22.0: the non-split path's
flash_attn_varlen_func without s_aux=self.sinks). Tiny upstream/port trees per test, and one whole review."""
from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

from conftest import git
from typer.testing import CliRunner

from metax_audit import demo
from metax_audit.cli import app
from metax_audit.core.models import Severity
from metax_audit.stages.checks.omitted_keywords import check_omitted_keywords

REL = "v1/attention/backends/fa.py"
UPSTREAM = """\
from kernels import varlen


class Impl:
    def forward(self, q, k, v, meta, out):
        out[:n] = varlen(q=q[:n], k=k, v=v, cu_seqlens_q=meta.cu_q, max_seqlen_q=meta.max_q,
                         causal=meta.causal, softcap=self.softcap, s_aux=self.sinks)
        return out
"""
# A vendor switch splits upstream's call in two; the call left on upstream's path lost s_aux.
PORT = """\
from kernels import varlen


class Impl:
    def forward(self, q, k, v, meta, out):
        if SPLIT:
            out[d:n] = varlen(q=q[d:n], k=k, v=v, cu_seqlens_q=meta.prefill_q, max_seqlen_q=meta.max_prefill,
                              causal=meta.causal, softcap=self.softcap, s_aux=self.sinks)
            out[:d] = varlen(q=q[:d], k=k, v=v, cu_seqlens_q=meta.decode_q, max_seqlen_q=1,
                             causal=True, softcap=self.softcap, s_aux=self.sinks)
            return out
        else:
            out[:n] = varlen(q=q[:n], k=k, v=v, cu_seqlens_q=meta.cu_q, max_seqlen_q=meta.max_q,
                             causal=meta.causal, softcap=self.softcap)
            return out
"""


def _check(tmp_path: Path, port: str, upstream: str = UPSTREAM) -> list:
    for root, text in ((tmp_path / "port" / "vllm_metax", port), (tmp_path / "up" / "vllm", upstream)):
        path = root / REL
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return list(check_omitted_keywords(tmp_path / "port", tmp_path / "up", {f"vllm_metax/{REL}": f"vllm/{REL}"}))


def test_the_call_on_upstreams_path_that_drops_a_keyword_the_others_pass(tmp_path: Path) -> None:
    [f] = _check(tmp_path, PORT)
    assert (f.rule, f.severity, f.location.line) == ("MXA213", Severity.WARNING, 13)
    assert "forward calls varlen without s_aux=" in f.message and "line 8" in f.message
    port, sibling, upstream = f.evidence
    assert port.startswith(f"port: vllm_metax/{REL}:13: out[:n] = varlen(") and "no s_aux=" in port
    assert sibling == f"port passes it: vllm_metax/{REL}:8: causal=meta.causal, softcap=self.softcap, s_aux=self.sinks)"
    assert upstream == f"upstream: vllm/{REL}:7: causal=meta.causal, softcap=self.softcap, s_aux=self.sinks)"
    assert f.sites[0].keywords == ("varlen:-s_aux",) and f.sites[0].upstream == f"vllm/{REL}:7"


def test_every_call_passing_it_or_none_is_nothing(tmp_path: Path) -> None:
    assert _check(tmp_path, PORT.replace("softcap=self.softcap)", "softcap=self.softcap, s_aux=self.sinks)")) == []
    # upstream does not pass it: the port's keyword is the port's own
    assert _check(tmp_path / "b", PORT, UPSTREAM.replace(", s_aux=self.sinks", "")) == []


def test_a_vendor_added_call_leaving_it_out_is_not_upstreams_pair(tmp_path: Path) -> None:
    # a stage-1/stage-2 split (vllm_metax fused_moe): the stage-1 call mirrors upstream's, keyword included, so the
    # stage-2 call the vendor added is nobody's pair
    up = """\
    def experts(ids, cfg, n):
        return align(ids, cfg["M"], n, ignore_invalid=True)
    """
    port = """\
    def experts(ids, cfg1, cfg2, n):
        a = align(ids, cfg1["M"], n, ignore_invalid=True)
        b = align(ids, cfg2["M"], n)
        return a, b
    """
    assert _check(tmp_path, port, up) == []


def test_a_comment_at_the_call_naming_the_keyword_is_the_ports_reason(tmp_path: Path) -> None:
    explained = PORT.replace("        else:\n", "        else:\n            # no s_aux here: this path never serves sink models\n")
    assert _check(tmp_path, explained) == []


def test_method_calls_and_star_keywords_are_not_paired(tmp_path: Path) -> None:
    # `wrapper.plan` may be two wrapper classes in two branches; **kwargs hides what is passed
    as_method = PORT.replace("varlen(", "self.kernel.varlen(")
    assert _check(tmp_path, as_method, UPSTREAM.replace("varlen(", "self.kernel.varlen(")) == []
    starred = PORT.replace("softcap=self.softcap)\n            return out\n", "softcap=self.softcap, **extra)\n            return out\n")
    assert _check(tmp_path / "b", starred) == []


def test_the_review_reports_it_at_warning_with_its_evidence(tmp_path: Path) -> None:
    # the demo port with one more backend file and its upstream counterpart
    repo = demo.build_demo_repo(tmp_path / "repo")
    upstream = tmp_path / "upstream"
    shutil.copytree(demo.upstream_root(), upstream)
    for root, text in ((repo / "vllm_metax", PORT), (upstream / "vllm", UPSTREAM)):
        (root / REL).write_text(textwrap.dedent(text), encoding="utf-8")
    git(repo, "add", "-A")
    r = CliRunner().invoke(app, ["review", "--staged", "--repo", str(repo), "--upstream", str(upstream), "--format", "json",
                                 "--output-dir", str(tmp_path / "out"), "--no-baseline", "--fail-on", "never"])
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    [f] = [f for f in data["findings"] if f["rule"] == "MXA213"]
    assert (f["severity"], f["path"], f["line"]) == ("warning", f"vllm_metax/{REL}", 13)
    assert any(e.startswith(f"upstream: vllm/{REL}:7:") for e in f["evidence"])
