# Fuzzing harness: random mutations of the demo port and of a real-port-shaped fixture, plus targeted
# deep nesting, each reviewed in a subprocess; a crash, a traceback, a change to the repo or code of
# the repo that ran is a failure. Prints the statistics as JSON and a Markdown table.
"""Usage: python benchmarks/fuzz_review.py [--cases 200] [--seed 17] [--keep-failures DIR]

Every case starts from a fresh copy of one of two fixtures:
  demo   the bundled demo port (metax_audit.demo), staged + unstaged + untracked changes;
  shaped a port laid out like vllm-metax (v1/attention/backends, backends/mla, ops, model_executor,
         models/*/attention.py, a platform registering every backend, a pyproject config),
         built from the demo's backend sources.
It applies 1-3 random mutations (line deletion, duplication, swap, truncation, token garbage,
identifier swaps, non-UTF-8 bytes, empty file, a huge line, a file renamed to a name with control
characters, a directory replaced by a symlink leaving the repo, module-level code that writes a
marker) or one targeted deep-nesting case (binary chains, unary chains, nested calls, nested lists,
attribute chains, nested blocks, each at a random depth), then runs
`python -m metax_audit review --worktree` with the demo upstream. Expected: exit 0 or 1 (or 2 with a
one-line message that is not "internal error"), the repo byte-identical, no marker written.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

from metax_audit import demo  # noqa: E402

GIT = ["git", "-c", "user.name=f", "-c", "user.email=f@example.com", "-c", "commit.gpgsign=false"]


def git(repo: Path, *args: str) -> None:
    subprocess.run([*GIT, "-C", str(repo), *args], check=True, capture_output=True)


def build_shaped(dest: Path) -> Path:
    """A port laid out like vllm-metax, from the demo port's sources."""
    src = demo.port_root() / "vllm_metax"
    pkg = dest / "vllm_metax"
    shutil.copytree(src, pkg)
    backends = pkg / "v1" / "attention" / "backends"
    (backends / "mla").mkdir(exist_ok=True)
    (backends / "mla" / "__init__.py").write_text("")
    for i, py in enumerate(sorted(p for p in backends.glob("*.py") if p.name != "__init__.py")):
        shutil.copy(py, backends / "mla" / f"mla_{i}_{py.name}")
    for sub in ("model_executor/layers/attention", "models/deepseek_v2", "models/qwen3"):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
        (pkg / sub / "__init__.py").write_text("")
        first = next(p for p in backends.glob("*.py") if p.name != "__init__.py")
        shutil.copy(first, pkg / sub / "attention.py")
    for d in pkg.rglob("*"):
        if d.is_dir() and not (d / "__init__.py").exists():
            (d / "__init__.py").write_text("")
    (dest / "pyproject.toml").write_text('[project]\nname = "vllm-metax"\n\n[tool.metax-audit]\nport-package = "vllm_metax"\n')
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "shaped")
    return dest


def fingerprint(repo: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(repo.rglob("*")):
        rel = p.relative_to(repo).as_posix()
        if rel.startswith(".git/") and rel != ".git/index":
            continue
        h.update(rel.encode("utf-8", "surrogateescape"))
        if p.is_symlink():
            h.update(b"L" + os.readlink(p).encode("utf-8", "surrogateescape"))
        elif p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


IDENTS = ["forward", "query", "self", "kv_cache", "None", "scale", "metadata", "layer", "torch", "flashinfer"]
GARBAGE = ["(", ")", "[", "]", ":", "lambda", "**", "=", "yield", "@", "\\", '"""', "'", "if", "else", "->", "async"]


DEEP_KINDS = ["binop", "unary", "calls", "lists", "attrs", "subscripts", "ifexp", "strings", "boolops", "compare"]


def _deep_expr(rng: random.Random, kind: str, n: int) -> str:
    """One expression nested `n` deep (bounded where the parser itself refuses deeper)."""
    if kind == "binop":
        return " + ".join(["a"] * n)
    if kind == "unary":
        return "-" * n + "1"
    if kind == "calls":
        n = min(n, 190)  # the parser refuses 200 nested parentheses itself
        return "f(" * n + ")" * n
    if kind == "lists":
        n = min(n, 190)
        return "[" * n + "]" * n
    if kind == "attrs":
        return "a" + ".b" * n
    if kind == "subscripts":
        n = min(n, 190)
        return "a[" * n + "0" + "]" * n
    if kind == "ifexp":
        return " if c else ".join(["a"] * n)
    if kind == "strings":
        return "(\n" + "\n".join(f"    'a{i}'" for i in range(n)) + ")"
    if kind == "boolops":
        return " and ".join(f"(a or b{i})" for i in range(n))
    return "a" + " < a" * n


def _deep(rng: random.Random) -> tuple[str, str]:
    kind = rng.choice([*DEEP_KINDS, "blocks"])
    n = rng.choice([20, 60, 99, 101, 150, 190, 500, 2000, 5000])
    if kind == "blocks":
        n = min(n, 98)  # the tokenizer refuses 100 indentation levels
        code = "\n".join("    " * i + "if x:" for i in range(n)) + "\n" + "    " * n + "pass"
    else:
        code = "X = " + _deep_expr(rng, kind, n)
    return f"deep-{kind}", code + "\n"


# Where a deep expression goes so that each stage meets it: inside a call the trace records (wrapping
# the call, as an argument, as a keyword: trace, the call checks, dataflow), a method's return value
# (dataflow), a class attribute (capability and graph-capture checks), a decorator and a default
# (discover, compare's signatures), a module constant (inventory); findings and the report carry it.
DEEP_PLACES = ["wrap-call", "call-arg", "call-kwarg", "return", "class-attr", "decorator", "default", "module"]
_CALL_LINE = re.compile(r"^(?P<indent>[ \t]{8,})(?P<lhs>(?:[\w.]+(?:\s*,\s*[\w.]+)*\s*=\s*)?)(?P<call>[\w.]+\()(?P<rest>.*)$")


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth < 0:
            return False
    return depth == 0 and "#" not in text and '"' not in text and "'" not in text


def place_deep(repo: Path, rng: random.Random) -> str | None:
    """Put one deep expression at a stage-targeted place of a random port file; its name, or None
    when the file offers no such place (the caller picks another)."""
    files = sorted(p for p in (repo / "vllm_metax").rglob("*.py") if p.is_file() and not p.is_symlink())
    target = rng.choice(files)
    place = rng.choice(DEEP_PLACES)
    kind = rng.choice(DEEP_KINDS)
    expr = _deep_expr(rng, kind, rng.choice([20, 99, 150, 190, 400, 900, 1500, 2500, 5000]))
    lines = target.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    if place in ("wrap-call", "call-arg", "call-kwarg"):
        calls = [i for i, ln in enumerate(lines) if (m := _CALL_LINE.match(ln.rstrip("\n"))) and _balanced(m.group("call") + m.group("rest"))]
        if not calls:
            return None
        i = rng.choice(calls)
        m = _CALL_LINE.match(lines[i].rstrip("\n"))
        assert m is not None
        head, call, rest = m.group("indent") + m.group("lhs"), m.group("call"), m.group("rest")
        if place == "wrap-call":  # the call becomes the innermost operand of the deep expression
            body = f"{call}{rest}"
            new = f"{head}({body}) + {expr}" if kind in ("binop", "compare", "boolops") else f"{head}[{body}, {expr}]"
        elif place == "call-arg":
            new = f"{head}{call}{expr}, {rest}" if rest.strip() != ")" else f"{head}{call}{expr})"
        else:
            close = rest.rfind(")")
            sep = "" if rest[:close].strip() == "" else ", "
            new = f"{head}{call}{rest[:close]}{sep}deep_kw={expr}{rest[close:]}"
        lines[i] = new + "\n"
    elif place == "return":
        defs = [i for i, ln in enumerate(lines) if re.match(r"^[ \t]+def \w+\(.*\).*:\s*$", ln)]
        if not defs:
            return None
        i = rng.choice(defs)
        indent = re.match(r"^[ \t]*", lines[i]).group(0) + "    "
        lines.insert(i + 1, f"{indent}return {expr}\n")
    elif place in ("class-attr", "decorator"):
        classes = [i for i, ln in enumerate(lines) if re.match(r"^class \w+.*:\s*$", ln)]
        if not classes:
            return None
        i = rng.choice(classes)
        if place == "class-attr":
            name = rng.choice(["supported_dtypes", "supported_kv_cache_dtypes", "cudagraph_support", "accept_output_buffer", "deep_attr"])
            lines.insert(i + 1, f"    {name} = {expr}\n")
        else:
            lines.insert(i, f"@({expr})\n")
    elif place == "default":
        defs = [i for i, ln in enumerate(lines) if re.match(r"^[ \t]*def \w+\((self|cls)?[^)]*\).*:\s*$", ln)]
        if not defs:
            return None
        i = rng.choice(defs)
        close = lines[i].rindex(")")
        inner = lines[i][lines[i].index("(") + 1:close]
        sep = ", " if inner.strip() and not inner.rstrip().endswith(",") else ""
        if "*" in inner:  # after *args/**kwargs a default is not where it may go: keyword-only
            return None
        lines[i] = lines[i][:close] + f"{sep}deep_default={expr}" + lines[i][close:]
    else:
        lines.append(f"DEEP = {expr}\n")
    target.write_text("".join(lines))
    return f"deep@{place}-{kind}"


def mutate(repo: Path, rng: random.Random, marker_dir: Path, deep_only: bool = False) -> list[str]:
    files = sorted(p for p in (repo / "vllm_metax").rglob("*.py") if p.is_file() and not p.is_symlink())
    done: list[str] = []
    if deep_only or rng.random() < 0.3:
        for _ in range(20):  # a stage-targeted place (most of the time), else the module-level statement
            if rng.random() < 0.8 and (name := place_deep(repo, rng)):
                return [name]
        target = rng.choice(files)
        name, code = _deep(rng)
        lines = target.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        at = rng.randrange(len(lines) + 1)
        # at module level, or inside a method body when that is where the line falls
        indent = "" if at == len(lines) else lines[at][: len(lines[at]) - len(lines[at].lstrip())]
        block = "".join(indent + ln + "\n" for ln in code.splitlines())
        lines.insert(at, block)
        target.write_text("".join(lines))
        return [name]
    for _ in range(rng.randint(1, 3)):
        files = sorted(p for p in (repo / "vllm_metax").rglob("*.py") if p.is_file() and not p.is_symlink())
        if not files:
            break
        target = rng.choice(files)
        data = target.read_bytes()
        lines = data.decode("utf-8", errors="replace").splitlines(keepends=True) or ["\n"]
        op = rng.choice(["delete", "duplicate", "swap", "truncate", "garbage", "ident", "bytes", "empty", "huge",
                         "rename-control", "symlink-dir", "marker"])
        if op == "delete":
            del lines[rng.randrange(len(lines))]
            target.write_text("".join(lines))
        elif op == "duplicate":
            i = rng.randrange(len(lines))
            lines.insert(i, lines[i])
            target.write_text("".join(lines))
        elif op == "swap":
            i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
            target.write_text("".join(lines))
        elif op == "truncate":
            target.write_bytes(data[: rng.randrange(len(data) + 1)])
        elif op == "garbage":
            i = rng.randrange(len(lines))
            lines[i] = lines[i].rstrip("\n") + " " + " ".join(rng.choice(GARBAGE) for _ in range(rng.randint(1, 4))) + "\n"
            target.write_text("".join(lines))
        elif op == "ident":
            text = "".join(lines)
            a, b = rng.sample(IDENTS, 2)
            target.write_text(text.replace(a, b))
        elif op == "bytes":
            pos = rng.randrange(len(data) + 1)
            target.write_bytes(data[:pos] + bytes(rng.randrange(128, 256) for _ in range(3)) + data[pos:])
        elif op == "empty":
            target.write_text("")
        elif op == "huge":
            target.write_text("".join(lines) + "X = '" + "x" * 200_000 + "'\n")
        elif op == "rename-control":
            target.rename(target.with_name(f"ctl\x1b[31m\x07 {target.name}"))
        elif op == "symlink-dir":
            outside = marker_dir / f"outside-{rng.randrange(10**6)}"
            shutil.copytree(target.parent, outside)
            shutil.rmtree(target.parent)
            os.symlink(os.path.relpath(outside, target.parent.parent), target.parent)
        elif op == "marker":
            target.write_text(f"import pathlib\npathlib.Path({str(marker_dir / 'RAN')!r}).write_text('x')\n" + "".join(lines))
        done.append(op)
    return done


def run_case(i: int, fixture: str, rng: random.Random, work: Path, deep_only: bool = False) -> dict:
    case = work / f"case-{i}"
    case.mkdir()
    repo = demo.build_demo_repo(case / "port") if fixture == "demo" else build_shaped(case / "port")
    ops = mutate(repo, rng, case, deep_only)
    before = fingerprint(repo)
    cmd = [sys.executable, "-m", "metax_audit", "review", "--worktree", "--upstream", str(demo.upstream_root()),
           "--output-dir", str(case / "out"), "--format", "json,md,sarif,junit"]
    env = {**os.environ, "PYTHONPATH": str(PROJECT), "CI": "1", "TMPDIR": str(case)}
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
        code, err = done.returncode, done.stderr
    except subprocess.TimeoutExpired:
        code, err = 124, "timeout"
    seconds = time.perf_counter() - start
    err_lines = [ln for ln in err.splitlines() if ln.startswith("metax-audit: error:")]
    crash = code not in (0, 1, 2) or "Traceback" in err or "internal error" in err
    report = case / "out" / "report.json"
    too_deep = report.is_file() and "too deep" in report.read_text(encoding="utf-8", errors="replace")
    return {
        "case": i, "fixture": fixture, "ops": ops, "exit": code, "seconds": round(seconds, 2),
        "crash": crash, "repo_changed": fingerprint(repo) != before, "marker_ran": (case / "RAN").exists(),
        "error": err_lines[0] if err_lines else "", "too_deep": too_deep,
        "leftover_tmp": sorted(p.name for p in case.glob("metax-audit-*")),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--keep-failures", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="write every case's record here")
    ap.add_argument("--deep-only", action="store_true", help="every case is one deep-nesting case")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="mxa-fuzz-"))
    records = []
    try:
        for i in range(args.cases):
            rec = run_case(i, "demo" if i % 2 == 0 else "shaped", rng, work, args.deep_only)
            records.append(rec)
            bad = rec["crash"] or rec["repo_changed"] or rec["marker_ran"] or rec["leftover_tmp"]
            if bad:
                print(json.dumps(rec), file=sys.stderr, flush=True)
                if args.keep_failures:
                    shutil.copytree(work / f"case-{i}", args.keep_failures / f"case-{i}", symlinks=True)
            shutil.rmtree(work / f"case-{i}", ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    exits = Counter(r["exit"] for r in records)
    ops = Counter(op for r in records for op in r["ops"])
    stats = {
        "cases": len(records), "seed": args.seed,
        "by_fixture": dict(Counter(r["fixture"] for r in records)),
        "exit_codes": {str(k): v for k, v in sorted(exits.items())},
        "crashes": sum(r["crash"] for r in records),
        "repo_changed": sum(r["repo_changed"] for r in records),
        "marker_ran": sum(r["marker_ran"] for r in records),
        "leftover_tmp": sum(bool(r["leftover_tmp"]) for r in records),
        "deep_cases": sum(1 for r in records if r["ops"] and r["ops"][0].startswith("deep")),
        "deep_places": dict(Counter(r["ops"][0].rsplit("-", 1)[0] for r in records if r["ops"] and r["ops"][0].startswith("deep@"))),
        "deep_not_analysed": sum(1 for r in records if r.get("too_deep")),
        "mutations": dict(sorted(ops.items())),
        "exit2_messages": dict(Counter(r["error"].split(":")[2].strip()[:60] if r["error"].count(":") >= 2 else r["error"]
                                       for r in records if r["exit"] == 2).most_common(8)),
        "median_s": round(statistics.median(r["seconds"] for r in records), 2) if records else 0,
        "max_s": max((r["seconds"] for r in records), default=0),
    }
    if args.json:
        args.json.write_text(json.dumps({"stats": stats, "records": records}, indent=1) + "\n")
    print(json.dumps(stats, indent=1))
    return 1 if stats["crashes"] or stats["repo_changed"] or stats["marker_ran"] or stats["leftover_tmp"] else 0


if __name__ == "__main__":
    sys.exit(main())
