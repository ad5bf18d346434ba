# Benchmark: `metax-audit review` of a port checkout against `griffe check` on the same machine in
# the same run (DESIGN.md's target: no slower than griffe, peak memory under 500 MB).
"""Usage: python benchmarks/review_vs_griffe.py PORT_REPO --upstream DIR [--rev master] [--old v0.22.0] [--repeat 3]

Runs each command `--repeat` times in a subprocess, reports median wall time, the ratio
review/griffe and the peak RSS of the review process (ru_maxrss of the child). Nothing is cached
between repeats except what the tools cache themselves (the upstream sources are passed as a directory).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("repo")
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--rev", default="master")
    ap.add_argument("--old", default="v0.22.0")
    ap.add_argument("--package", default="vllm_metax")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--python", default=None, help="kernel-stack interpreter for the introspection subprocess")
    args = ap.parse_args()

    out = tempfile.mkdtemp(prefix="mxa-bench-")
    review = [sys.executable, "-m", "metax_audit", "review", "--rev", args.rev, "--upstream", args.upstream,
              "--format", "json", "--output-dir", out, "--fail-on", "never"]
    if args.python:
        review += ["--python", args.python]
    griffe = [shutil.which("griffe") or "griffe", "check", args.package, "-a", args.old, "-b", args.rev]
    rows = {}
    for name, cmd in (("griffe", griffe), ("review", review)):
        walls, peaks, codes = [], [], []
        for _ in range(args.repeat):
            # ru_maxrss of children is a high-water mark over all children: measure each tool in
            # a fresh interpreter so the review's figure is its own.
            probe = subprocess.run(
                [sys.executable, "-c",
                 "import resource,subprocess,sys,time,json;t=time.perf_counter();"
                 "r=subprocess.run(sys.argv[2:],cwd=sys.argv[1],capture_output=True);"
                 "print(json.dumps([time.perf_counter()-t,r.returncode,resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))",
                 args.repo, *cmd], capture_output=True, text=True, env={**os.environ, "CI": "1"})
            wall, code, peak = json.loads(probe.stdout)
            walls.append(wall)
            peaks.append(peak)
            codes.append(code)
        rows[name] = {"median_s": round(statistics.median(walls), 3), "runs_s": [round(w, 3) for w in walls],
                      "peak_rss_mb": round(max(peaks) / 1024, 1), "exit_codes": codes}
    rows["ratio_review_over_griffe"] = round(rows["review"]["median_s"] / rows["griffe"]["median_s"], 2)
    rows["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    print(json.dumps(rows, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
