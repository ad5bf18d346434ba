"""History cases: does the review name the kind of a fixed bug at the fixed lines of the fix's parent,
and is that finding gone at the fix? A measurement (run by hand on the real targets), not a CI test.

    python3 benchmarks/history_cases.py benchmarks/history/metax.json --out /tmp/hist-metax \
        [--python /work/targets/fi-venv/bin/python] [--only FIX,...] [--table reports/history/metax.md]

The case file (JSON) names the port checkout (`repo`: environment variables expanded, e.g.
"${HISTORY_TARGETS}/ascend" with HISTORY_TARGETS defaulting to /work/targets; --repo overrides it), its
config (`config`: a relative path is read from this metax-audit checkout; --config overrides it), and one
record per fixed site:
  fix        the fixing commit; the parent `fix^` is the buggy revision
  path       the fixed file (repo-relative, at the parent)
  lines      [first, last] line of the fixed site at the parent (a finding there; when none is, one within `slack` lines)
  kind       import | undefined-name | attribute | signature | registration | compiled-call |
             custom-op | torch-ops | runtime-name | override | omitted-keyword | semantic (what breaks)
  visible    whether a static tool could see it at all (semantic fixes: false, and not reviewed)
  also       other [path, first, last] sites where the same root cause may be reported
  upstream / base   the vLLM release the parent followed and the one before
Reviews are grouped by (upstream, base) so that the cached upstream of one release serves its cases;
each revision is reviewed once (cached reviews reused between runs of the script: --rerun to redo).
A case is "found" when a finding of one of the kind's rules or categories lies at the site at the
parent (its location, a site it lists, or a "port: PATH:LINE" line of its evidence), and "gone" when
nothing of it is shown at the fix: no finding at warning or error with that finding's id, or of the
same rule at the same path with the same message, that still names the site's file (one finding may
stand for several sites: the fix of one leaves the others). An info left with the same id (an import
in the branch of a version test the release does not take) is named in the row's "left at info".
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

# What counts as "the right kind": rule ids first (exact), else categories.
KIND_RULES: dict[str, set[str]] = {
    "import": {"MXA120", "MXA121", "MXA122", "MXA124", "MXA126", "MXA054"},
    "undefined-name": {"MXA127"},
    "runtime-name": {"MXA123", "MXA127"},
    "attribute": {"MXA125", "MXA128", "MXA129"},
    "signature": {"MXA101", "MXA102", "MXA103", "MXA104", "MXA105", "MXA107", "MXA108", "MXA109"},
    "compiled-call": {"MXA112", "MXA102", "MXA105", "MXA107", "MXA108", "MXA109"},
    "custom-op": {"MXA175", "MXA107", "MXA108", "MXA109"},
    "torch-ops": {"MXA174", "MXA170"},
    "registration": set(),
    "override": {"MXA207", "MXA208"},
    "omitted-keyword": {"MXA213"},
}
KIND_CATEGORIES: dict[str, set[str]] = {
    "registration": {"registration"},
    "signature": {"signature", "kwargs-swallowed"},
    "import": {"import"},
}
SEVERITY = {"info": 0, "warning": 1, "error": 2}


def _review(repo: Path, rev: str, up: str, base: str, out: Path, python: str | None, config: str | None,
            rerun: bool, allow_unbound: str | None = None) -> tuple[dict | None, float, str]:
    report = out / "report.json"
    if report.is_file() and not rerun:
        return json.loads(report.read_text(encoding="utf-8")), 0.0, "kept"
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "metax_audit", "review", "--rev", rev, "--repo", str(repo), "--upstream", f"vllm=={up}",
           "--base", f"vllm=={base}", "--format", "json", "--output-dir", str(out), "--fail-on", "never", "--no-baseline"]
    if python:
        cmd += ["--python", python]
    if config:
        cmd += ["--config", config]
    if allow_unbound:
        cmd += ["--allow-unbound", allow_unbound]
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env={**os.environ, "CI": "1"})
    wall = time.monotonic() - t0
    (out / "review.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    if not report.is_file():
        return None, wall, f"exit {done.returncode}: {(done.stderr or done.stdout).strip().splitlines()[-1:]}"
    return json.loads(report.read_text(encoding="utf-8")), wall, f"exit {done.returncode}"


def _of_kind(f: dict, kind: str) -> bool:
    return f["rule"] in KIND_RULES.get(kind, set()) or f["category"] in KIND_CATEGORIES.get(kind, set())


_SITE = re.compile(r"^port: ([^:]+):(\d+):")


def _at_site(f: dict, case: dict, slack: int) -> bool:
    """At the site: the finding's location, or one of the other sites of its root cause that its
    evidence names ("port: PATH:LINE: ...", one finding per root cause)."""
    sites = [(case["path"], *case["lines"]), *(tuple(a) for a in case.get("also", ()))]
    where = [(f["path"], f.get("line") or 0)]
    where += [(m.group(1), int(m.group(2))) for ev in f.get("evidence", ()) if (m := _SITE.match(ev))]
    where += [(x["path"], x.get("line") or 0) for x in f.get("sites", ()) if x.get("path")]
    return any(p == path and lo - slack <= line <= hi + slack for p, line in where for path, lo, hi in sites)


def _norm(msg: str) -> str:
    return re.sub(r":\d+", ":N", msg)


def judge(case: dict, parent: dict | None, fix: dict | None, slack: int) -> dict:
    row = {k: case.get(k) for k in ("fix", "kind", "path", "lines", "visible", "upstream", "base", "note")}
    if not case["visible"]:
        row.update(found=None, gone=None, finding=None)
        return row
    if parent is None or fix is None:
        row.update(found=None, gone=None, finding=None, note=f"review failed; {case.get('note', '')}")
        return row
    # the findings at the fixed lines themselves; only when none is, those within `slack` lines of them
    hits = [f for f in parent["findings"] if _of_kind(f, case["kind"]) and _at_site(f, case, 0)] or \
        [f for f in parent["findings"] if _of_kind(f, case["kind"]) and _at_site(f, case, slack)]
    hits.sort(key=lambda f: -SEVERITY[f["severity"]])
    row["found"] = bool(hits)
    row["finding"] = f"{hits[0]['severity']} {hits[0]['rule']} {hits[0]['path']}:{hits[0]['line']} {hits[0]['message'][:140]}" if hits else None
    row["severity"] = hits[0]["severity"] if hits else None
    if hits:
        files = {case["path"], *(a[0] for a in case.get("also", ()))}

        def same(g: dict, h: dict) -> bool:
            return g["id"] == h["id"] or (g["rule"], g["path"], _norm(g["message"])) == (h["rule"], h["path"], _norm(h["message"]))

        left = [g for g in fix["findings"] if any(same(g, h) for h in hits) and _files(g) & files]
        row["gone"] = not [g for g in left if g["severity"] != "info"]
        row["left_info"] = next((f"{g['rule']} {g['path']}:{g['line']}" for g in left if g["severity"] == "info"), None)
    else:
        row["gone"] = None
    return row


def _files(f: dict) -> set[str]:
    """The files a finding names: its location, its sites, the "port: PATH:LINE" lines of its evidence."""
    out = {f["path"], *(x["path"] for x in f.get("sites", ()) if x.get("path"))}
    return out | {m.group(1) for ev in f.get("evidence", ()) if (m := _SITE.match(ev))}


def table(rows: list[dict], title: str, source: str = "") -> str:
    lines = [f"# {title}", "",
             f"Produced by `python3 benchmarks/history_cases.py {source}` (found: a finding of the kind at the fixed lines of "
             "the parent, reviewed at the release it followed; gone: nothing of it left at warning or error at the fix; "
             "see the script's docstring).", "",
             "| fix commit | kind | site (at the parent) | statically visible? | found at parent? | gone at fix? | finding at the parent |",
             "|---|---|---|---|---|---|---|"]
    yn = {True: "yes", False: "no", None: "-"}
    for r in rows:
        site = f"{r['path']}:{r['lines'][0]}" + (f"-{r['lines'][1]}" if r["lines"][1] != r["lines"][0] else "")
        lines.append(f"| {r['fix']} ({r['upstream']}/{r['base']}) | {r['kind']} | `{site}` | {yn[r['visible']]} | "
                     f"{yn[r.get('found')]} | {yn[r.get('gone')]}{' (left at info: ' + r['left_info'] + ')' if r.get('left_info') else ''} | "
                     f"{(r.get('finding') or r.get('note') or '').replace('|', '/')} |")
    vis = [r for r in rows if r["visible"]]
    ok = [r for r in vis if r.get("found") and r.get("gone")]
    at_error = [r for r in ok if r.get("severity") == "error"]
    lines += ["", f"Cases: {len(rows)} ({len({r['fix'] for r in rows})} fix commits); statically visible: {len(vis)}; "
              f"found at the parent and gone at the fix: {len(ok)} of {len(vis)}"
              + (f" ({100 * len(ok) / len(vis):.0f}%)" if vis else "") + f", of them at error: {len(at_error)}.", ""]
    kinds = sorted({r["kind"] for r in rows})
    lines += ["| kind | cases | visible | found and gone | at error |", "|---|---|---|---|---|"]
    for k in kinds:
        rs = [r for r in rows if r["kind"] == k]
        v = [r for r in rs if r["visible"]]
        g = [r for r in v if r.get("found") and r.get("gone")]
        lines.append(f"| {k} | {len(rs)} | {len(v)} | {len(g)} | {sum(1 for r in g if r.get('severity') == 'error')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cases")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--python")
    ap.add_argument("--only", default="")
    ap.add_argument("--slack", type=int, default=2)
    ap.add_argument("--rerun", action="store_true")
    ap.add_argument("--table", type=Path)
    ap.add_argument("--repo", type=Path, help="the port checkout (overrides the case file's repo)")
    ap.add_argument("--config", type=Path, help="the port's config (overrides the case file's config)")
    ap.add_argument("--allow-unbound", help="PKG[,PKG] passed to each review: pinned kernel packages without a public base")
    args = ap.parse_args(argv)
    spec = json.loads(Path(args.cases).read_text(encoding="utf-8"))
    repo = args.repo or Path(os.path.expandvars(spec["repo"].replace("${HISTORY_TARGETS}", os.environ.get("HISTORY_TARGETS", "/work/targets"))))
    config = str(args.config) if args.config else spec.get("config")
    if config and not Path(config).is_absolute():
        config = str(Path(__file__).resolve().parents[1] / config)
    cases = [c for c in spec["cases"] if not args.only or c["fix"] in args.only.split(",")]
    reviews: dict[str, dict | None] = {}
    for case in sorted(cases, key=lambda c: (c["upstream"], c["base"], c["fix"])):
        if not case["visible"]:  # nothing a static review could find: not reviewed
            continue
        for rev in (f"{case['fix']}^", case["fix"]):
            key = f"{rev}@{case['upstream']}"
            if key in reviews:
                continue
            out = args.out / f"{case['upstream']}-{case['base']}" / rev.replace("^", "-parent")
            got, wall, how = _review(repo, rev, case["upstream"], case["base"], out, args.python, config, args.rerun, args.allow_unbound)
            reviews[key] = got
            print(f"{rev} vllm {case['upstream']}/{case['base']}: {how}, {wall:.1f} s", file=sys.stderr, flush=True)
    rows = [judge(c, reviews.get(f"{c['fix']}^@{c['upstream']}"), reviews.get(f"{c['fix']}@{c['upstream']}"), args.slack) for c in cases]
    (args.out / "results.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
    text = table(rows, spec.get("title", "History cases"), Path(args.cases).as_posix())
    if args.table:
        args.table.parent.mkdir(parents=True, exist_ok=True)
        args.table.write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
