# Benchmark: review time against the number of files in scope (synthetic port, generated in a temp
# dir), to show time proportional to the work and the report's wall time being the real one.
"""Usage: python benchmarks/scale_review.py [--sizes 1000,5000,10000] [--profile DIR]

For each size N: a git repo holding a port package with N backend modules in scope (each a class
with a method calling a kernel), an upstream tree with a counterpart for every module that differs
from it in one call (so compare and the checks produce findings on every file), then one
`python -m metax_audit review --staged` in a subprocess. Prints one JSON line per size: the wall
time measured outside the process, the `wall_seconds` the report states, the time of each stage,
the time spent after the stages (report writing), files, findings, and seconds per 1000 files.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]

PORT_MODULE = '''\
from vllm_metax.kernels import paged_decode


class MacaGen{i}Impl:
    """Synthetic backend {i}."""

    def forward(self, query, key_cache, value_cache, scale):
        # Metax Modification: the vendor kernel takes the scale as a keyword
        out = paged_decode(query, key_cache, value_cache, softmax_scale=scale, block={b})
        return out * {i}
'''

UPSTREAM_MODULE = '''\
from vllm.kernels import paged_decode


class Gen{i}Impl:
    """Synthetic backend {i}."""

    def forward(self, query, key_cache, value_cache, scale):
        out = paged_decode(query, key_cache, value_cache, scale, block={b})
        return out * {i}
'''


def build(root: Path, n: int) -> tuple[Path, Path]:
    repo, upstream = root / "port", root / "upstream"
    gen = repo / "vllm_metax" / "v1" / "attention" / "backends" / "gen"
    up = upstream / "vllm" / "v1" / "attention" / "backends" / "gen"
    gen.mkdir(parents=True)
    up.mkdir(parents=True)
    for pkg in (repo / "vllm_metax", repo / "vllm_metax" / "v1", repo / "vllm_metax" / "v1" / "attention",
                repo / "vllm_metax" / "v1" / "attention" / "backends", gen):
        (pkg / "__init__.py").write_text("")
    (repo / "vllm_metax" / "kernels.py").write_text("def paged_decode(q, k, v, *, softmax_scale, block):\n    return q\n")
    (repo / "vllm_metax" / "platform.py").write_text("class MacaPlatform:\n    device_name = 'maca'\n")
    (upstream / "vllm" / "__init__.py").write_text("__version__ = '0.26.0'\n")
    (upstream / "vllm" / "kernels.py").write_text("def paged_decode(q, k, v, scale, block):\n    return q\n")
    for i in range(n):
        (gen / f"mod_{i}.py").write_text(PORT_MODULE.format(i=i, b=16 if i % 3 else 32))
        (up / f"mod_{i}.py").write_text(UPSTREAM_MODULE.format(i=i, b=16))
    git = ["git", "-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    return repo, upstream


def measure(n: int, keep: bool, profile: Path | None = None) -> dict:
    root = Path(tempfile.mkdtemp(prefix="mxa-scale-"))
    try:
        repo, upstream = build(root, n)
        out = root / "out"
        env = {**os.environ, "PYTHONPATH": str(PROJECT), "CI": "1", "METAX_AUDIT_CACHE": str(root / "cache")}
        prof = ["-m", "cProfile", "-o", str(profile / f"review-{n}.prof")] if profile else []
        cmd = [sys.executable, *prof, "-m", "metax_audit", "review", "--staged", "--upstream", str(upstream),
               "--output-dir", str(out), "--fail-on", "never"]
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            return {"files": n, "error": done.stderr.strip().splitlines()[-1:]}
        report = json.loads((out / "report.json").read_text())
        stages = {s["name"]: s["seconds"] for s in report["stages"]}
        return {
            "files": n,
            "in_scope": report["coverage"]["in_scope"],
            "findings": len(report["findings"]),
            "wall_s_measured": round(wall, 2),
            "wall_s_reported": report["wall_seconds"],
            "stages_s": stages,
            "s_per_1000_files": round(wall / n * 1000, 2),
        }
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,5000,10000")
    ap.add_argument("--keep", action="store_true", help="keep the generated trees (printed paths)")
    ap.add_argument("--profile", type=Path, default=None,
                    help="run each review under cProfile, writing DIR/review-N.prof (compare sizes with pstats)")
    args = ap.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    for n in (int(s) for s in args.sizes.split(",")):
        print(json.dumps(measure(n, args.keep, args.profile)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
