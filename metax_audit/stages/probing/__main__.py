# Device entry point without typer: `python -m metax_audit.stages.probing --backend flashinfer --out DIR`.
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from metax_audit.core.models import ProbeResult
from metax_audit.stages.probing.device_report import render_markdown, results_json
from metax_audit.stages.probing.run import probe_line, run_many
from metax_audit.stages.probing.targets import _family_of, applicable, backend_targets


def main(argv: Sequence[str] | None = None) -> int:
    """Device entry point without typer: `python -m metax_audit.stages.probing --backend flashinfer --out DIR`."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m metax_audit.stages.probing")
    p.add_argument("--backend", action="append", default=[])
    p.add_argument("--target", action="append", default=[], help="TARGET or TARGET@FAMILY; repeatable")
    p.add_argument("--probes", default="", help="comma-separated; default: all that apply")
    p.add_argument("--device", default="auto")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--extra", action="append", default=[], help="extra run TARGET|FAMILY|PROBE|k=v;k=v")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    from metax_audit.stages.probing.evidence import collect_environment, save_environment

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
    groups: dict[tuple[str, str], list[tuple[str, dict[str, str]]]] = {}
    for tgt, fam, probe, opts in jobs:
        groups.setdefault((tgt, fam), []).append((probe, opts))
    done: list[ProbeResult] = []

    def report(r: ProbeResult) -> None:
        done.append(r)
        print(probe_line(r), flush=True)
        # written after every probe: a command killed at its time limit still leaves a report
        (out / "probes.json").write_text(json.dumps(results_json(done, env), indent=2, default=str) + "\n")
        (out / "probes.md").write_text(render_markdown(done, env, title="metax-audit probe report") + "\n")

    results = run_many([(t, f, js) for (t, f), js in groups.items()], device=a.device, timeout=a.timeout, on_result=report)
    (out / "probes.json").write_text(json.dumps(results_json(results, env), indent=2, default=str) + "\n")
    (out / "probes.md").write_text(render_markdown(results, env, title="metax-audit probe report") + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
