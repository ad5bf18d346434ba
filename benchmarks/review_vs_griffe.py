# Benchmark: `metax-audit review` of a port checkout against `griffe check` on the same machine in
# the same run (DESIGN.md's target: no slower than griffe, peak memory under 500 MB).
"""Usage: python benchmarks/review_vs_griffe.py PORT_REPO --upstream DIR [--rev master] [--old v0.22.0] [--repeat 3]

Runs each command `--repeat` times in a subprocess and reports median wall time, the ratios
review/griffe and two peak RSS figures: the review process itself, and the largest process of its
tree (the introspection worker, which imports the kernel stack and torch). The review runs twice
over: "cold", each repeat with an empty METAX_AUDIT_CACHE (the stack facts are captured again),
and "warm", with a cache primed by one unmeasured run (since the result cache, a warm review of
an unchanged revision is served whole). The upstream sources are passed as a directory, so
neither needs a download.

"review_no_cache" is `review --no-cache` with the stack facts in the primed cache (the issue's cold review: every
stage computed, the installed stack's facts and the public base read from the cache). "staged_one_file" is the pre-commit case: in a clone of the checkout whose HEAD review is cached
(one unmeasured `review --staged` with nothing changed), each repeat stages a code change of one
file (`--staged-file`; a new function appended) and runs `review --staged` (compared with HEAD). With
`--reference-tree DIR` the cold review also runs with DIR first on PYTHONPATH ("reference_cold":
another build of metax-audit, e.g. a checkout of an earlier commit), in the same interleaved run;
the rows "reference_warm" and "reference_staged_one_file" (ask for them in `--rows`) time that tree warm
and staged too, with a cache and a clone of its own primed the same way (a change to the cache itself is
measured before/after in one run).

Every command runs with Python's bytecode cache on, in a private PYTHONPYCACHEPREFIX primed by the
unmeasured runs (griffe's too), as an installed tool runs: where PYTHONDONTWRITEBYTECODE is set (this
project's sandbox sets it), each metax-audit process otherwise compiles its ~60 modules anew, about
0.5 s that an installation never pays; `--no-bytecode-cache` keeps the environment as it is.
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


def _griffe() -> str:
    """griffe's own script beside this interpreter, as the review runs with sys.executable itself: the
    `griffe` on PATH may be a version manager's shim (pyenv's is a bash script that resolves the version
    first: 0.3-1.0 s on this machine), which would time the shim, not griffe, and flatter every ratio."""
    here = os.path.join(os.path.dirname(sys.executable), "griffe")
    return here if os.access(here, os.X_OK) else shutil.which("griffe") or "griffe"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("repo")
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--rev", default="master")
    ap.add_argument("--old", default="v0.22.0")
    ap.add_argument("--package", default="vllm_metax")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--python", default=None, help="kernel-stack interpreter for the introspection subprocess")
    ap.add_argument("--staged-file", default="vllm_metax/v1/attention/backends/flashinfer.py",
                    help="the file the staged one-file change edits")
    ap.add_argument("--reference-tree", default=None, help="another metax-audit source tree to time cold, for comparison")
    ap.add_argument("--base", default=None, help="--base of the reviews (the release the port was last synced to)")
    ap.add_argument("--allow-unbound", default=None, help="--allow-unbound of the reviews (pinned kernel packages with no public base)")
    ap.add_argument("--no-bytecode-cache", action="store_true", help="leave PYTHONDONTWRITEBYTECODE as it is")
    ap.add_argument("--tmpdir", default=None,
                    help="TMPDIR of every measured command (e.g. /dev/shm): griffe checks the old revision out into a "
                         "temporary worktree and the review exports its snapshot there; on a disk whose writeback "
                         "lags (a VM), griffe's system time grew 0.4 -> 1.3 s over three runs in a row")
    ap.add_argument("--rows", default="griffe,review_cold,review_warm,staged_one_file,reference_cold",
                    help="which measurements to run (griffe always runs: the ratios divide by it)")
    args = ap.parse_args()

    load_start = os.getloadavg()[0]  # other work on the machine weighs on every row; said with the results
    out = tempfile.mkdtemp(prefix="mxa-bench-")
    review = [sys.executable, "-m", "metax_audit", "review", "--rev", args.rev, "--upstream", args.upstream,
              "--format", "json", "--output-dir", out, "--fail-on", "never"]
    if args.python:
        review += ["--python", args.python]
    if args.base:
        review += ["--base", args.base]
    if args.allow_unbound:
        review += ["--allow-unbound", args.allow_unbound]
    griffe = [_griffe(), "check", args.package, "-a", args.old, "-b", args.rev]
    # The review runs in-process under a tiny wrapper so its own ru_maxrss can be read at exit;
    # RUSAGE_CHILDREN of the probe then gives the largest process of the whole tree.
    # (at exit: the CLI ends with os._exit once its atexit handlers ran, so a `finally` would not run)
    wrapped = [sys.executable, "-c",
               "import atexit,resource,runpy,sys\n"
               "atexit.register(lambda: sys.stderr.write('MXA_SELF_RSS %d\\n'%resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))\n"
               "sys.argv=['metax-audit',*sys.argv[1:]]\n"
               "runpy.run_module('metax_audit',run_name='__main__')\n",
               *review[3:]]
    warm_cache = tempfile.mkdtemp(prefix="mxa-bench-cache-")
    base_env = {**os.environ, "CI": "1"}
    if args.tmpdir:
        base_env["TMPDIR"] = os.path.abspath(args.tmpdir)
    pycache = None
    if not args.no_bytecode_cache:
        pycache = tempfile.mkdtemp(prefix="mxa-bench-pyc-")
        base_env.pop("PYTHONDONTWRITEBYTECODE", None)
        base_env["PYTHONPYCACHEPREFIX"] = pycache
        subprocess.run(griffe, cwd=args.repo, capture_output=True, env=base_env)  # compiles griffe's modules
    subprocess.run(wrapped, cwd=args.repo, capture_output=True, env={**base_env, "METAX_AUDIT_CACHE": warm_cache})
    # The pre-commit case: a clone whose HEAD review is in the cache, then one staged file per repeat.
    clone = os.path.join(tempfile.mkdtemp(prefix="mxa-bench-clone-"), "port")
    subprocess.run(["git", "clone", "-q", args.repo, clone], check=True)
    subprocess.run(["git", "-C", clone, "checkout", "-q", args.rev], check=True)
    staged = [*wrapped[:3], "review", "--staged", *review[6:]]  # review[4:6] is --rev REV
    subprocess.run(staged, cwd=clone, capture_output=True, env={**base_env, "METAX_AUDIT_CACHE": warm_cache})
    ref_env = {**base_env, "PYTHONPATH": os.path.abspath(args.reference_tree)} if args.reference_tree else None
    wanted = {"griffe", *args.rows.split(",")}
    ref_cache, ref_clone = tempfile.mkdtemp(prefix="mxa-bench-ref-cache-"), None
    if ref_env is not None and wanted & {"reference_warm", "reference_staged_one_file", "reference_no_cache"}:
        subprocess.run(wrapped, cwd=args.repo, capture_output=True, env={**ref_env, "METAX_AUDIT_CACHE": ref_cache})
        ref_clone = os.path.join(tempfile.mkdtemp(prefix="mxa-bench-ref-clone-"), "port")
        subprocess.run(["git", "clone", "-q", args.repo, ref_clone], check=True)
        subprocess.run(["git", "-C", ref_clone, "checkout", "-q", args.rev], check=True)
        subprocess.run(staged, cwd=ref_clone, capture_output=True, env={**ref_env, "METAX_AUDIT_CACHE": ref_cache})
    # "no_cache" is the cold review, `--no-cache`: nothing of the review is read from the result cache
    # (every stage computed), while the facts of the installed stack (the stack cache, keyed by the interpreter's
    # sys.path: a property of the environment, not of the review) and the public base come from the primed cache.
    no_cache = [*wrapped, "--no-cache"]
    plan = [("griffe", griffe, args.repo, base_env), ("review_cold", wrapped, args.repo, base_env),
            ("review_warm", wrapped, args.repo, base_env), ("staged_one_file", staged, clone, base_env),
            ("review_no_cache", no_cache, args.repo, base_env)]
    if ref_env is not None:
        plan.append(("reference_cold", wrapped, args.repo, ref_env))
        plan.append(("reference_warm", wrapped, args.repo, ref_env))
        plan.append(("reference_no_cache", no_cache, args.repo, ref_env))
        if ref_clone is not None:
            plan.append(("reference_staged_one_file", staged, ref_clone, ref_env))
    plan = [p for p in plan if p[0] in wanted]
    rows = {}
    results: dict[str, tuple[list, list, list, list]] = {}
    # Repeats are interleaved (griffe, cold, warm, ..., griffe, ...) so that load from anything
    # else on the machine weighs on all of them alike.
    for i in range(args.repeat):
        for name, cmd, cwd, env in plan:
            walls, peaks, selfs, codes = results.setdefault(name, ([], [], [], []))
            cache = tempfile.mkdtemp(prefix="mxa-bench-cold-") if name.endswith("_cold") else \
                ref_cache if name.startswith("reference_") else warm_cache
            if name.endswith("staged_one_file"):
                path = os.path.join(cwd, args.staged_file)
                with open(path, "a", encoding="utf-8") as fh:
                    # a code change (a new function), not a comment: the file's chains and checks must be redone
                    fh.write(f"\n\ndef _benchmark_edit_{i}():\n    return {i}\n")
                subprocess.run(["git", "-C", cwd, "add", args.staged_file], check=True)
            # ru_maxrss of children is a high-water mark over all children: measure each run in
            # a fresh interpreter so each figure is its own.
            probe = subprocess.run(
                [sys.executable, "-c",
                 "import resource,subprocess,sys,time,json;t=time.perf_counter();"
                 "r=subprocess.run(sys.argv[2:],cwd=sys.argv[1],capture_output=True,text=True);"
                 "w=time.perf_counter()-t;"
                 "s=[int(x.split()[1]) for x in r.stderr.splitlines() if x.startswith('MXA_SELF_RSS ')];"
                 "print(json.dumps([w,r.returncode,resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,s[0] if s else None]))",
                 cwd, *cmd], capture_output=True, text=True,
                env={**env, "METAX_AUDIT_CACHE": cache})
            wall, code, peak, own = json.loads(probe.stdout)
            walls.append(wall)
            peaks.append(peak)
            codes.append(code)
            if own is not None:
                selfs.append(own)
            if name.endswith("_cold"):
                shutil.rmtree(cache, ignore_errors=True)
    for name, (walls, peaks, selfs, codes) in results.items():
        rows[name] = {"median_s": round(statistics.median(walls), 3), "runs_s": [round(w, 3) for w in walls],
                      "peak_rss_mb_largest_process": round(max(peaks) / 1024, 1), "exit_codes": codes}
        if selfs:
            rows[name]["peak_rss_mb_review_process"] = round(max(selfs) / 1024, 1)
    for name in ("review_cold", "review_warm", "staged_one_file", "review_no_cache", "reference_cold", "reference_warm",
                 "reference_staged_one_file", "reference_no_cache"):
        if name in rows:
            rows[f"ratio_{name}_over_griffe"] = round(rows[name]["median_s"] / rows["griffe"]["median_s"], 2)
    if "reference_cold" in rows:
        rows["ratio_review_cold_over_reference_cold"] = round(rows["review_cold"]["median_s"] / rows["reference_cold"]["median_s"], 2)
    for mine, ref in (("review_warm", "reference_warm"), ("staged_one_file", "reference_staged_one_file"),
                      ("review_no_cache", "reference_no_cache")):
        if mine in rows and ref in rows:
            rows[f"ratio_{mine}_over_{ref}"] = round(rows[mine]["median_s"] / rows[ref]["median_s"], 2)
    shutil.rmtree(warm_cache, ignore_errors=True)
    shutil.rmtree(ref_cache, ignore_errors=True)
    if ref_clone is not None:
        shutil.rmtree(os.path.dirname(ref_clone), ignore_errors=True)
    if pycache is not None:
        shutil.rmtree(pycache, ignore_errors=True)
    shutil.rmtree(os.path.dirname(clone), ignore_errors=True)
    rows["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "bytecode_cache": pycache is not None,
                       "tmpdir": base_env.get("TMPDIR", tempfile.gettempdir()),
                       "load_average_1m_start_end": [round(load_start, 2), round(os.getloadavg()[0], 2)]}
    print(json.dumps(rows, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
