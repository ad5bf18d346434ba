# `python -m probes run ...` runs one probe on one target and prints its outcome as one JSON line
# (what metax_audit.probing runs in a subprocess, and how a user reruns one case); `list` describes.
from __future__ import annotations

import argparse
import json
import sys

MARKER = "PROBE-OUTCOME "


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m probes", description="Run one discriminating probe on one target.")
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
    args = parser.parse_args(argv)

    from probes.registry import registry

    if args.cmd == "list":
        reg = registry()
        print(json.dumps({
            "probes": {n: {"families": list(p.families), "category": p.category, "summary": p.summary, "needs_cuda": p.needs_cuda} for n, p in reg.probes.items()},
            "families": {n: {"builtin_targets": list(f.builtin_targets), "controls": list(f.controls), "convention": f.convention} for n, f in reg.families.items()},
            "broken_modules": reg.broken,
        }, indent=2))
        return 0
    from probes.base import ProbeContext
    from probes.runner import run_one

    options = dict(o.split("=", 1) for o in args.option)
    outcome = run_one(args.probe, args.family, args.target, ProbeContext(device=args.device, seed=args.seed, options=options))
    text = json.dumps(outcome.to_json())
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    sys.stdout.flush()
    print(MARKER + text, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
