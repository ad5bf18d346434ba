# The probe stage: runs each probe of the top-level `probes` package in its own subprocess (so a
# crashing or hanging kernel is a recorded result), maps backends/traces to targets, and files findings.
from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from metax_audit.errors import ProbeError
from metax_audit.findings import make_finding, rule
from metax_audit.models import BackendChain, Category, Finding, Location, ProbeResult, Severity
from metax_audit.subproc import run_python

MARKER = "PROBE-OUTCOME "
_PROBES_ROOT = Path(__file__).resolve().parent.parent  # the directory holding the `probes` package

BUILTIN_PROBES = ("lse", "layout", "fp8-scale", "dcp", "query-count", "padding", "graph-capture")
BUILTIN_FAMILIES = ("paged-decode", "paged-prefill", "ragged-prefill", "merge-states", "dcp-local-seq-lens")


def _discover() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Probes and families the `probes` package provides (h2o joins when present); the built-in
    lists when the package cannot be imported here (it runs in the target interpreter anyway)."""
    try:
        from probes.registry import registry

        reg = registry()
        probes = tuple(dict.fromkeys((*BUILTIN_PROBES, *reg.probes)))
        families = tuple(dict.fromkeys((*BUILTIN_FAMILIES, *reg.families)))
        return probes, families
    except Exception:
        return BUILTIN_PROBES, BUILTIN_FAMILIES


PROBES, FAMILIES = _discover()

# Which probes apply to which family (the CLI's default probe list for a target).
APPLIES: dict[str, tuple[str, ...]] = {
    "paged-decode": ("lse", "layout", "fp8-scale", "dcp", "padding", "graph-capture"),
    "paged-prefill": ("lse", "layout", "fp8-scale", "query-count", "padding"),
    "ragged-prefill": ("lse", "layout", "fp8-scale", "query-count", "padding"),
    "merge-states": ("lse", "dcp"),
    "dcp-local-seq-lens": ("dcp",),
}



def applicable(family: str) -> tuple[str, ...]:
    """The probes that apply to a family: the built-in table, else what the probe modules declare
    (an add-on family such as h2o-scores)."""
    if family in APPLIES:
        return APPLIES[family]
    try:
        from probes.registry import registry

        return tuple(n for n, p in registry().probes.items() if family in p.families)
    except Exception:
        return ()


_BACKENDS: dict[str, list[tuple[str, str]]] = {
    "flashinfer": [
        ("flashinfer:BatchDecodeWithPagedKVCacheWrapper", "paged-decode"),
        ("flashinfer:BatchPrefillWithPagedKVCacheWrapper", "paged-prefill"),
        ("flashinfer:BatchPrefillWithRaggedKVCacheWrapper", "ragged-prefill"),
        ("flashinfer:merge_state", "merge-states"),
    ],
    "torch-reference": [
        ("torch-reference", "paged-decode"),
        ("torch-reference", "paged-prefill"),
        ("torch-reference", "ragged-prefill"),
        ("torch-reference:base-e", "merge-states"),
        ("torch-reference", "dcp-local-seq-lens"),
    ],
}
_NO_ADAPTER = {
    "triton": "vLLM's Triton attention ops have no built-in adapter yet; probe one with --target MOD:CALLABLE --family paged-decode",
    "flash_attn": "flash-attn has no built-in adapter yet; probe it with --target MOD:CALLABLE --family ragged-prefill",
}

# Resolved callee name (suffix) -> (built-in target, family), for targets_from_trace.
_TRACE_MAP = (
    ("BatchDecodeWithPagedKVCacheWrapper", _BACKENDS["flashinfer"][0]),
    ("BatchPrefillWithPagedKVCacheWrapper", _BACKENDS["flashinfer"][1]),
    ("BatchPrefillWithRaggedKVCacheWrapper", _BACKENDS["flashinfer"][2]),
    ("flashinfer.merge_state", _BACKENDS["flashinfer"][3]),
    ("flashinfer.cascade.merge_state", _BACKENDS["flashinfer"][3]),
)

# ---------------------------------------------------------------- rules (MXA400-MXA449)

_CATEGORY = {
    "lse": Category.LSE, "layout": Category.LAYOUT, "fp8-scale": Category.FP8_SCALE, "dcp": Category.DCP,
    "query-count": Category.QUERY_COUNT, "padding": Category.PADDING, "graph-capture": Category.GRAPH_CAPTURE,
}
_MISMATCH_RULE = {"lse": "MXA400", "layout": "MXA401", "fp8-scale": "MXA402", "dcp": "MXA403", "query-count": "MXA404",
                  "padding": "MXA405", "graph-capture": "MXA406"}
_ERROR_RULE = {"lse": "MXA410", "layout": "MXA411", "fp8-scale": "MXA412", "dcp": "MXA413", "query-count": "MXA414",
               "padding": "MXA415", "graph-capture": "MXA416"}
_HELP_MISMATCH = {
    "lse": "The kernel's LSE is not in the base or layout that was expected (the convention's base e, [tokens, heads], or what the target declares). A consumer that merges partial results (cascade, DCP, chunked prefill) with the other base silently mixes wrong weights. Convert at the call site or declare the base.",
    "layout": "The kernel read the KV cache in another layout than it was told (NHD vs HND), or ignored the strides of a view into a joint [N, 2, ...] allocation. Pass the layout the cache really has, or make the cache contiguous.",
    "fp8-scale": "With an FP8 KV cache and k_scale=2, v_scale=0.25, the output matched scales that were ignored, inverted, swapped or applied twice. Check how the call site passes k_scale/v_scale and whether the kernel already folds them in.",
    "dcp": "Partial attention over interleaved KV shards, merged with the given merge function, is not full attention: the producer's LSE base and the merger's assumed base differ, or the per-rank lengths are wrong. Convert the LSE before merging or use the matching merge.",
    "query-count": "With mixed query lengths in one batch the output matched another causal alignment (top-left or none) than bottom-right. Check qo_indptr/causal arguments at the call site.",
    "padding": "Padded requests (zero length, -1 block-table holes) changed real outputs, or padded heads were returned as real heads.",
    "graph-capture": "After capture, in-place changes of inputs and metadata and a replay, the output did not follow the new inputs: the target captured a stale pointer or a host-side value (e.g. a sequence length).",
}
for _p, _rid in _MISMATCH_RULE.items():
    rule(_rid, _CATEGORY[_p], Severity.ERROR, f"kernel semantics differ from the expected {_p} hypothesis (probe mismatch)", _HELP_MISMATCH[_p])
for _p, _rid in _ERROR_RULE.items():
    rule(_rid, _CATEGORY[_p], Severity.WARNING, f"the {_p} probe could not finish: the target raised, crashed or hung",
         "The probe ran in its own subprocess and the target raised an exception, died (signal) or timed out. The traceback or stderr tail is the evidence; until it runs, the semantics it checks are unvalidated.")
rule("MXA407", Category.COVERAGE, Severity.ERROR, "kernel semantics differ from the expected hypothesis of an add-on probe",
     "A probe outside the built-in set (e.g. h2o) found a mismatch; its per-hypothesis errors are the evidence.")
rule("MXA417", Category.COVERAGE, Severity.WARNING, "an add-on probe could not finish: the target raised, crashed or hung",
     "As MXA410-MXA416, for a probe outside the built-in set.")
rule("MXA420", Category.COVERAGE, Severity.INFO, "probe not checkable: the target lacks a control the probe needs",
     "The target's signature has no way to ask for what the probe needs (no LSE return, no scale argument, no layout switch). The probe failed closed; the contract stays unvalidated. The inspected signature is the evidence.")


# ---------------------------------------------------------------- running


def run_probes(
    *,
    target: str,
    family: str | None,
    probes: Sequence[str],
    device: str = "auto",
    timeout: float = 300,
    python: str | None = None,
    extra_path: Sequence[Path] = (),
    options: Mapping[str, str] | None = None,
) -> list[ProbeResult]:
    """Run each probe on `target` in its own `python -m probes run` subprocess.

    `family` may be None for a built-in target name that belongs to exactly one family. An
    empty `probes` means every probe that applies to the family. `python` is the target
    interpreter (default: this one); `extra_path` is prepended to its PYTHONPATH (after the
    directory holding `probes`). A crash, non-JSON output or a timeout is an `error` result."""
    fam = family or _family_of(target)
    if fam not in FAMILIES:
        raise ProbeError(f"unknown kernel family {fam!r}; known: {', '.join(FAMILIES)}")
    unknown = [p for p in probes if p not in PROBES]
    if unknown:
        raise ProbeError(f"unknown probe(s) {', '.join(unknown)}; known: {', '.join(PROBES)}")
    chosen = list(probes) or list(applicable(fam))
    env = {"PYTHONPATH": os.pathsep.join([str(_PROBES_ROOT), *map(str, extra_path), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "PYTHONUNBUFFERED": "1"}
    results = []
    for probe in chosen:
        args = ["-m", "probes", "run", "--probe", probe, "--family", fam, "--target", target, "--device", device]
        for k, v in (options or {}).items():
            args += ["--option", f"{k}={v}"]
        done = run_python(python or sys.executable, args, env=env, timeout=timeout)
        results.append(_parse(done, probe, fam, target, timeout, options or {}))
    return results


def _family_of(target: str) -> str:
    owners = [fam for fam, pairs in _families_by_target().items() if target in pairs]
    if len(owners) == 1:
        return owners[0]
    raise ProbeError(f"target {target!r} needs --family (one of {', '.join(FAMILIES)})")


def _families_by_target() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for pairs in _BACKENDS.values():
        for t, f in pairs:
            out.setdefault(f, set()).add(t)
    out.setdefault("paged-decode", set()).add("torch-sdpa")
    return out


def _parse(done: Any, probe: str, family: str, target: str, timeout: float, options: Mapping[str, str]) -> ProbeResult:
    rerun = f"python -m probes run --probe {probe} --family {family} --target {target}" + "".join(f" --option {k}={v}" for k, v in options.items())
    if done.timed_out:
        return ProbeResult(probe, family, target, "error", skipped_reason=f"timed out after {timeout:g}s (hung kernel or JIT build)",
                           details={"stderr_tail": done.stderr[-2000:], "rerun": rerun, "category": _category_name(probe)})
    line = next((ln for ln in reversed(done.stdout.splitlines()) if ln.startswith(MARKER)), None)
    if line is None:
        why = f"exited with {done.returncode}" + (f" (signal {-done.returncode})" if done.returncode < 0 else "")
        return ProbeResult(probe, family, target, "error", skipped_reason=f"probe process {why} before printing a result",
                           details={"stderr_tail": done.stderr[-2000:], "stdout_tail": done.stdout[-500:], "rerun": rerun, "category": _category_name(probe)})
    data = json.loads(line[len(MARKER):])
    return from_outcome(data, rerun=rerun)


def from_outcome(data: Mapping[str, Any], *, rerun: str = "") -> ProbeResult:
    """A `probes` outcome JSON as the pipeline's ProbeResult (the full record kept in details)."""
    dev = data.get("device") or {}
    device = dev.get("device", "?")
    if dev.get("gpu"):
        device += f": {dev['gpu']} (sm {dev.get('capability', '?')})"
    device += f", torch {dev.get('torch', '?')}"
    hyps = {h: _num(v.get("abs")) for h, v in (data.get("hypotheses") or {}).items()}
    reason = data.get("skipped_reason")
    return ProbeResult(
        probe=data["probe"], family=data["family"], target=data["target"], verdict=data["verdict"], matched=data.get("matched"),
        expected=data.get("expected"), hypotheses=hyps, worst_error=_num(data.get("worst_error")), device=device,
        skipped_reason=reason, details={**dict(data), "rerun": rerun, "category": _category_name(data["probe"])},
    )


def _num(x: Any) -> float | None:
    if x is None:
        return None
    return float(x)  # "inf" strings from the JSON become float('inf')


def _category_name(probe: str) -> str:
    return _CATEGORY[probe].value if probe in _CATEGORY else Category.COVERAGE.value


def backend_targets(backend: str) -> list[tuple[str, str]]:
    """(target, family) pairs with built-in adapters for a backend name (flashinfer,
    torch-reference; `FLASHINFER` and `flash-attn` spellings accepted)."""
    key = backend.strip().lower().replace("-", "_")
    key = {"torch_reference": "torch-reference", "flash_attention": "flash_attn", "flash_attn": "flash_attn"}.get(key, key)
    if key in _BACKENDS:
        return list(_BACKENDS[key])
    if key in _NO_ADAPTER:
        raise ProbeError(_NO_ADAPTER[key])
    raise ProbeError(f"no probe targets for backend {backend!r}; known: {', '.join([*_BACKENDS, *_NO_ADAPTER])}")


def targets_from_trace(chain: BackendChain) -> list[tuple[str, str]]:
    """The built-in targets a traced backend really calls (its resolved call sites and chain
    hops), in call order, each once; a chain calling no adapted kernel gives []."""
    names = [c.resolved for c in chain.calls if c.resolved] + [h.resolved or h.qualname for h in chain.chain]
    out: list[tuple[str, str]] = []
    for name in names:
        for suffix, pair in _TRACE_MAP:
            if (suffix in name) and pair not in out:
                out.append(pair)
    return out


# ---------------------------------------------------------------- findings


def probe_findings(results: Iterable[ProbeResult]) -> Iterator[Finding]:
    """A mismatch, an error (crash, hang, exception in the target) or a not-checkable result
    becomes a finding with the per-hypothesis errors and the device as evidence."""
    for r in results:
        loc = Location(path=f"probe:{r.target}", line=0, symbol=f"{r.probe}/{r.family}")
        ev = _evidence(r)
        if r.verdict == "mismatch":
            rid = _MISMATCH_RULE.get(r.probe, "MXA407")
            got = r.matched or "no hypothesis"
            yield make_finding(rid, loc, f"{r.target} ({r.family}) {r.probe}: matched {got!r}, expected {r.expected!r}", ev)
        elif r.verdict == "error":
            rid = _ERROR_RULE.get(r.probe, "MXA417")
            yield make_finding(rid, loc, f"{r.target} ({r.family}) {r.probe}: {r.skipped_reason}", ev)
        elif r.verdict == "not-checkable":
            yield make_finding("MXA420", loc, f"{r.target} ({r.family}) {r.probe} not checkable: {r.skipped_reason}", ev)


def _evidence(r: ProbeResult) -> list[str]:
    ev = [f"probe {r.probe} on {r.target} ({r.family}), device {r.device}"]
    if r.expected:
        ev.append(f"expected {r.expected}, matched {r.matched}")
    for h, e in sorted(r.hypotheses.items(), key=lambda kv: (kv[1] is None, kv[1] or 0.0)):
        ev.append(f"hypothesis {h}: worst abs error {e:.3g}" if e is not None else f"hypothesis {h}: no error recorded")
    for c in r.details.get("cases", ())[:4]:
        ev.append(f"case {c.get('name')}: matched {c.get('matched')}")
    ev += [str(x) for x in r.details.get("evidence", ())][:3]
    if r.details.get("stderr_tail"):
        ev.append("stderr tail: " + r.details["stderr_tail"][-400:])
    if r.details.get("rerun"):
        ev.append(f"rerun: {r.details['rerun']}")
    return ev


# ---------------------------------------------------------------- report (device runs)


def render_markdown(results: Sequence[ProbeResult], environment: Mapping[str, Any] | None = None, title: str = "Probe report") -> str:
    lines = [f"# {title}", ""]
    if environment:
        lines += ["## Environment", ""]
        for k in ("gpu", "gpu_count", "capability", "driver", "torch", "torch_build", "triton", "cuda_runtime", "python", "os"):
            if k in environment:
                lines.append(f"- **{k}**: {environment[k]}")
        for name, info in (environment.get("packages") or {}).items():
            lines.append(f"- **package {name}**: {info}")
        lines.append("")
    lines += ["## Verdicts", "", "| probe | family | target | verdict | matched | expected | worst error vs expected | device |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        we = "" if r.worst_error is None else f"{r.worst_error:.3g}"
        lines.append(f"| {r.probe} | {r.family} | `{r.target}` | **{r.verdict}** | {r.matched or ''} | {r.expected or ''} | {we} | {r.device or ''} |")
    lines += ["", "## Per-hypothesis errors (worst abs / rel over cases)", ""]
    for r in results:
        opts = r.details.get("options")
        lines.append(f"### {r.probe} · {r.family} · `{r.target}`" + (f" · options {opts}" if opts else ""))
        lines.append("")
        if r.skipped_reason:
            lines.append(f"- {r.verdict}: {r.skipped_reason}")
        for h, v in (r.details.get("hypotheses") or {}).items():
            lines.append(f"- `{h}`: abs {v.get('abs')}, rel {v.get('rel')}" + (" ← matched" if h == r.matched else ""))
        for c in r.details.get("cases", ()):
            lines.append(f"- case *{c.get('name')}*: matched **{c.get('matched')}**; shapes {c.get('shapes')}; dtypes {c.get('dtypes')}"
                         + (f"; strides {c.get('strides')}" if c.get("strides") else "") + (f"; {c['note']}" if c.get("note") else ""))
        for k, v in (r.details.get("details") or {}).items():
            lines.append(f"- {k}: {v}")
        for e in r.details.get("evidence", ()):
            lines.append(f"- evidence: {e}")
        if r.details.get("stderr_tail"):
            lines.append(f"- stderr tail: `{r.details['stderr_tail'][-300:]!s}`")
        lines.append(f"- seconds: {r.details.get('seconds')}; rerun: `{r.details.get('rerun', '')}`")
        lines.append("")
    return "\n".join(lines)


def results_json(results: Sequence[ProbeResult], environment: Mapping[str, Any] | None = None) -> dict[str, Any]:
    from dataclasses import asdict

    return {"schema": "metax-audit/probe-run/v1", "environment": dict(environment or {}), "probes": [
        {**asdict(r), "hypotheses": {k: (v if v is None or (v == v and abs(v) != float("inf")) else repr(v)) for k, v in r.hypotheses.items()}}
        for r in results]}


def write_probe_reports(results: Sequence[ProbeResult], environment: Mapping[str, Any], output_dir: Path) -> list[Path]:
    """probes.json + probes.md + environment.json under output_dir (the `probe` command's outputs)."""
    from metax_audit.evidence import save_environment

    output_dir.mkdir(parents=True, exist_ok=True)
    env_path = save_environment(environment, output_dir / "environment.json")
    json_path = output_dir / "probes.json"
    json_path.write_text(json.dumps(results_json(results, environment), indent=2, default=str) + "\n")
    md_path = output_dir / "probes.md"
    md_path.write_text(render_markdown(results, environment, title="metax-audit probe report") + "\n")
    return [md_path, json_path, env_path]


def main(argv: Sequence[str] | None = None) -> int:
    """Device entry point without typer: `python -m metax_audit.probing --backend flashinfer --out DIR`."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m metax_audit.probing")
    p.add_argument("--backend", action="append", default=[])
    p.add_argument("--target", action="append", default=[], help="TARGET or TARGET@FAMILY; repeatable")
    p.add_argument("--probes", default="", help="comma-separated; default: all that apply")
    p.add_argument("--device", default="auto")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--extra", action="append", default=[], help="extra run TARGET|FAMILY|PROBE|k=v;k=v")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    from metax_audit.evidence import collect_environment, save_environment

    pairs = [pair for b in a.backend for pair in backend_targets(b)]
    for t in a.target:
        tgt, _, fam = t.partition("@")
        pairs.append((tgt, fam or _family_of(tgt)))
    wanted = [x for x in a.probes.split(",") if x]
    jobs: list[tuple[str, str, str, dict[str, str]]] = []
    for spec in a.extra:  # the explicit pairings first: they are the runs asked for by name
        tgt, fam, probe, *rest = spec.split("|")
        jobs.append((tgt, fam, probe, dict(kv.split("=", 1) for kv in (rest[0].split(";") if rest and rest[0] else []))))
    for tgt, fam in pairs:
        jobs += [(tgt, fam, p, {}) for p in (wanted or applicable(fam)) if p in applicable(fam)]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = collect_environment(packages=("torch", "triton", "flashinfer-python", "flashinfer", "vllm", "flash-attn"))
    save_environment(env, out / "environment.json")
    results: list[ProbeResult] = []
    for tgt, fam, probe, opts in jobs:
        results += _run_tagged(tgt, fam, probe, a, opts)
        r = results[-1]
        print(f"{r.verdict:14} {r.probe:14} {r.family:15} {r.target:48} matched={r.matched} expected={r.expected} worst={r.worst_error} {opts or ''}", flush=True)
        # written after every probe: a command killed at its time limit still leaves a report
        (out / "probes.json").write_text(json.dumps(results_json(results, env), indent=2, default=str) + "\n")
        (out / "probes.md").write_text(render_markdown(results, env, title="metax-audit probe report") + "\n")
    return 0


def _run_tagged(tgt: str, fam: str, probe: str, a: Any, opts: Mapping[str, str]) -> list[ProbeResult]:
    from dataclasses import replace

    rs = run_probes(target=tgt, family=fam, probes=[probe], device=a.device, timeout=a.timeout, options=opts)
    return [replace(r, details={**r.details, "options": dict(opts)}) if opts else r for r in rs]


if __name__ == "__main__":
    raise SystemExit(main())
