# `python -m metax_audit.probes run ...` runs one probe on one target and prints its outcome as one JSON line
# (how a user reruns one case); `worker` runs every probe of one target in one process (what
# metax_audit.stages.probing starts, one per target); `list` describes.
from __future__ import annotations

import argparse
import json
import sys

MARKER = "PROBE-OUTCOME "
READY = "PROBE-READY "


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m metax_audit.probes", description="Run one discriminating probe on one target.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run one probe on one target; prints 'PROBE-OUTCOME {json}'")
    r.add_argument("--probe", required=True)
    r.add_argument("--family", required=True)
    r.add_argument("--target", required=True, help="a built-in target of the family, MOD:CALLABLE, MOD:FACTORY() or path.py:NAME")
    r.add_argument("--device", default="auto")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--option", action="append", default=[], help="k=v passed to the probe (merge=SPEC, producer=SPEC, simulate=1)")
    r.add_argument("--json-out", help="also write the outcome to this file")
    sub.add_parser("list", help="probes, families, built-in targets and conventions as JSON")
    w = sub.add_parser("worker", help="every probe of one target in this process: JSON jobs on stdin, one outcome line each")
    w.add_argument("--family", required=True)
    w.add_argument("--target", required=True)
    w.add_argument("--device", default="auto")
    w.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from metax_audit.stages.introspect_worker.fence import enter_site

    enter_site()  # started by metax-audit with -S: the port fence first, then site (metax_audit.core.subproc.fenced)
    if args.cmd == "worker":
        return worker(args.target, args.family, args.device, args.seed)

    from metax_audit.probes.registry import registry

    if args.cmd == "list":
        reg = registry()
        print(json.dumps({
            "probes": {n: {"families": list(p.families), "category": p.category, "summary": p.summary, "needs_cuda": p.needs_cuda} for n, p in reg.probes.items()},
            "families": {n: {"builtin_targets": list(f.builtin_targets), "controls": list(f.controls), "convention": f.convention} for n, f in reg.families.items()},
            "broken_modules": reg.broken,
        }, indent=2))
        return 0
    from metax_audit.probes.base import ProbeContext
    from metax_audit.probes.runner import run_one

    options = dict(o.split("=", 1) for o in args.option)
    outcome = run_one(args.probe, args.family, args.target, ProbeContext(device=args.device, seed=args.seed, options=options))
    text = json.dumps(outcome.to_json())
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    sys.stdout.flush()
    print(MARKER + text, flush=True)
    return 0


def worker(target: str, family: str, device: str, seed: int) -> int:
    """One process per target: torch, CUDA and the target's modules are initialised once. Prints
    `PROBE-READY {"loaded": bool, "error": str|null, "skipped": str|null}` after loading the target,
    then reads one JSON job per stdin line ({"probe": NAME, "options": {...}}) and prints one
    `PROBE-OUTCOME {json}` line for each, until stdin closes."""
    from metax_audit.probes.base import ProbeContext, ProbeSkip
    from metax_audit.probes.device import resolve
    from metax_audit.probes.registry import load_target
    from metax_audit.probes.runner import run_one

    ready: dict[str, object] = {"loaded": True, "error": None, "skipped": None}
    try:
        load_target(target, family, ProbeContext(device=resolve(device), seed=seed))
    except ProbeSkip as exc:
        ready["skipped"] = str(exc)
    except Exception as exc:  # a target that cannot be loaded: the caller stops with one line
        ready.update(loaded=False, error=f"{type(exc).__name__}: {str(exc)[:300]}")
    print(READY + json.dumps(ready), flush=True)
    if not ready["loaded"]:
        return 0
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        outcome = run_one(job["probe"], family, target, ProbeContext(device=device, seed=seed, options=dict(job.get("options") or {})))
        sys.stdout.flush()
        print(MARKER + json.dumps(outcome.to_json()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
