# The probe report of a device run (`metax-audit probe`, `python -m metax_audit.stages.probing`):
# Markdown and JSON of the results with the environment they ran in.
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from metax_audit.core.models import ProbeResult

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
    from metax_audit.stages.probing.evidence import save_environment

    output_dir.mkdir(parents=True, exist_ok=True)
    env_path = save_environment(environment, output_dir / "environment.json")
    json_path = output_dir / "probes.json"
    json_path.write_text(json.dumps(results_json(results, environment), indent=2, default=str) + "\n")
    md_path = output_dir / "probes.md"
    md_path.write_text(render_markdown(results, environment, title="metax-audit probe report") + "\n")
    return [md_path, json_path, env_path]
