# An adversarial sweep of metax-audit: each attack runs the CLI as a user would, against a fresh copy
# of the demo port, and is judged held or broke by the same rules; prints `attack -> result` lines.
"""Usage: python benchmarks/adversarial_sweep.py [--only SUBSTRING] [--json FILE] [--jobs N]

Run from a checkout (PYTHONPATH is set to it for the tool under attack). Every attack gets its own
temporary directory with a copy of the demo repository, a private TMPDIR, a private METAX_AUDIT_CACHE and a
marker directory. A run *broke* when any of these holds:

- it printed a traceback or "internal error", or hung (timeout);
- its exit code is not the one the attack expects (0/1 for a review that must succeed, 2 for bad input);
- a marker file appeared (a command the audited repo configures ran);
- the audited repository changed (status, index, worktree bytes, refs);
- something of ours was left in the private TMPDIR;
- a report is malformed (report.json/report.sarif do not parse, summary.md renders raw HTML);
- for cache attacks: the findings differ from a `--no-cache` review of the same tree.

Nothing here downloads anything: the upstream is the demo's bundled one. Not a CI step (it takes
minutes); its findings go into the session notes."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

from metax_audit import demo  # noqa: E402
from metax_audit.core import fstree, gitcmd  # noqa: E402

UPSTREAM = str(demo.upstream_root())
GIT = ["git", "-c", "user.name=s", "-c", "user.email=s@example.com", "-c", "commit.gpgsign=false"]
TIMEOUT = 120


@dataclass
class Ctx:
    root: Path
    repo: Path
    tmp: Path
    cache: Path
    out: Path
    markers: Path
    notes: list[str] = field(default_factory=list)
    check_repo: bool = True

    def git(self, *args: str, cwd: Path | None = None) -> str:
        return subprocess.run([*GIT, "-C", str(cwd or self.repo), *args], check=True, capture_output=True,
                              text=True).stdout

    def marker_cmd(self, name: str) -> str:
        script = self.root / f"mark-{name}.sh"
        script.write_text(f"#!/bin/sh\ntouch '{self.markers}/{name}'\ncat\n")
        script.chmod(0o755)
        return str(script)

    def env(self, **extra: str) -> dict[str, str]:
        env = {**os.environ, "PYTHONPATH": str(PROJECT), "CI": "1", "TMPDIR": str(self.tmp),
               "METAX_AUDIT_CACHE": str(self.cache), "COLUMNS": "200"}
        env.pop("PYTHONSAFEPATH", None)
        env.update(extra)
        return env

    def review_args(self, *extra: str, out: Path | None = None, fmt: str = "md,json,sarif") -> list[str]:
        return ["review", "--upstream", UPSTREAM, "--output-dir", str(out or self.out), "--format", fmt, *extra]


@dataclass
class Run:
    code: int | None
    stdout: str
    stderr: str
    timed_out: bool = False


def tool(ctx: Ctx, args: list[str], *, shell_suffix: str = "", env: dict[str, str] | None = None,
         cwd: Path | None = None, timeout: float = TIMEOUT) -> Run:
    """`python -m metax_audit ARGS` (under bash with `shell_suffix` when given: redirections, pipes)."""
    before = fingerprint(ctx.repo) if ctx.check_repo else ""
    try:
        return _tool(ctx, args, shell_suffix=shell_suffix, env=env, cwd=cwd, timeout=timeout)
    finally:
        if ctx.check_repo and fingerprint(ctx.repo) != before:
            ctx.notes.append("the audited repository changed")


def _tool(ctx: Ctx, args: list[str], *, shell_suffix: str, env: dict[str, str] | None, cwd: Path | None,
          timeout: float) -> Run:
    argv = [sys.executable, "-m", "metax_audit", *args]
    full_env = env or ctx.env()
    try:
        if shell_suffix:
            err = ctx.root / "stderr.txt"
            cmd = " ".join(shlex.quote(a) for a in argv)
            if shell_suffix.startswith("|"):
                script = f"{cmd} 2>{shlex.quote(str(err))} {shell_suffix}; exit ${{PIPESTATUS[0]}}"
            elif "2>&-" in shell_suffix:
                script = f"{cmd} {shell_suffix}"
            else:
                script = f"{cmd} {shell_suffix} 2>{shlex.quote(str(err))}"
            done = subprocess.run(["bash", "-c", script], cwd=cwd or ctx.repo, env=full_env, capture_output=True,
                                  text=True, timeout=timeout)
            return Run(done.returncode, done.stdout, err.read_text(errors="replace") if err.exists() else "")
        done = subprocess.run(argv, cwd=cwd or ctx.repo, env=full_env, capture_output=True, text=True,
                              timeout=timeout, errors="replace")
        return Run(done.returncode, done.stdout, done.stderr)
    except subprocess.TimeoutExpired as exc:
        return Run(None, str(exc.stdout or ""), str(exc.stderr or ""), timed_out=True)


def fingerprint(repo: Path) -> str:
    """The repository's index bytes, refs and every worktree file: read without running git's
    status (which would itself run the fsmonitor, clean filters and index hooks an attack arms, and
    rewrite the index)."""
    if not (repo / ".git").exists():
        return ""
    h = hashlib.sha256()
    index = repo / ".git" / "index"
    if index.exists():
        h.update(index.read_bytes())
    h.update(subprocess.run(gitcmd.command(repo, "for-each-ref"), env={**os.environ, **gitcmd.GIT_ENV},
                            capture_output=True).stdout)
    for dirpath, dirnames, filenames in fstree.walk(repo):  # os.walk recurses: a 2,000-deep attack
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for name in sorted(filenames):
            p = os.path.join(dirpath, name)
            h.update(p.encode(errors="surrogateescape"))
            try:
                if os.path.islink(p):
                    h.update(os.readlink(p).encode(errors="surrogateescape"))
                elif os.path.isfile(p):
                    with open(p, "rb") as fh:
                        h.update(fh.read())
            except OSError:
                pass
    return h.hexdigest()


def findings_of(out: Path) -> list[tuple[str, str, str]] | None:
    try:
        data = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        return None
    return sorted((f["id"], f["severity"], f.get("message", "")) for f in data.get("findings", []))


def malformed(out: Path) -> str | None:
    """Why the reports in `out` are malformed, or None (absent reports are not malformed here)."""
    if (out / "report.json").exists():
        try:
            json.loads((out / "report.json").read_text())
        except ValueError as exc:
            return f"report.json does not parse: {exc}"
    if (out / "report.sarif").exists():
        try:
            json.loads((out / "report.sarif").read_text())
        except ValueError as exc:
            return f"report.sarif does not parse: {exc}"
    pages = [out / "summary.md", *sorted((out / "files").glob("*.md"))] if (out / "summary.md").exists() else []
    try:
        from markdown_it import MarkdownIt
    except ImportError:
        return None
    md = MarkdownIt("commonmark").enable("table")
    allowed = {"p", "ul", "ol", "li", "code", "strong", "em", "a", "h1", "h2", "h3", "h4", "table", "thead", "tbody",
               "tr", "th", "td", "pre", "blockquote", "sub", "hr", "br", "details", "summary"}
    for page in pages:
        html = md.render(page.read_text(errors="replace"))
        tags = {m.group(1).lower() for m in re.finditer(r"<\s*/?\s*([A-Za-z][A-Za-z0-9-]*)", html)} - allowed
        if tags:
            return f"{page.name} renders raw HTML: {sorted(tags)}"
    return None


def leftovers(ctx: Ctx) -> list[str]:
    try:
        return sorted(p.name for p in ctx.tmp.iterdir() if p.name.startswith("metax-audit-"))
    except OSError:
        return []


@dataclass(frozen=True)
class Attack:
    name: str
    group: str
    run: Callable[[Ctx], Run | tuple[Run, str | None]]  # a Run, or (Run, extra verdict: None held / reason broke)
    expect: tuple[int, ...] = (0, 1)
    check_repo: bool = True


def judge(attack: Attack, ctx: Ctx) -> tuple[str, str]:
    ctx.check_repo = attack.check_repo
    start = time.perf_counter()
    try:
        got = attack.run(ctx)
    except Exception as exc:  # the harness's own failure: reported, never a silent pass
        return "error", f"harness: {type(exc).__name__}: {exc}"
    run, extra = got if isinstance(got, tuple) else (got, None)
    secs = time.perf_counter() - start
    why: list[str] = []
    if run.timed_out:
        why.append(f"hung (> {TIMEOUT}s)")
    if "Traceback" in run.stderr or "Traceback" in run.stdout:
        why.append("traceback")
    if "internal error" in run.stderr:
        why.append("internal error: " + next((ln for ln in run.stderr.splitlines() if "internal error" in ln), "")[:160])
    if not run.timed_out and run.code not in attack.expect:
        why.append(f"exit {run.code}, expected {'/'.join(map(str, attack.expect))}: "
                   + (run.stderr.strip().splitlines() or [""])[-1][:200])
    marks = sorted(p.name for p in ctx.markers.iterdir())
    if marks:
        why.append(f"repo-configured command ran: {', '.join(marks)}")
    why += sorted(set(ctx.notes))
    left = leftovers(ctx)
    if left:
        why.append(f"left in TMPDIR: {', '.join(left)[:160]}")
    bad = malformed(ctx.out)
    if bad:
        why.append(bad)
    if extra:
        why.append(extra)
    detail = f"exit {run.code}, {secs:.1f}s"
    return ("broke", "; ".join(why)) if why else ("held", detail)


# ---------------------------------------------------------------- attacks


def review(*extra: str, suffix: str = "", fmt: str = "md,json,sarif") -> Callable[[Ctx], Run]:
    return lambda ctx: tool(ctx, ctx.review_args(*extra, fmt=fmt), shell_suffix=suffix)


def arm_config(key: str, value_of: Callable[[Ctx], str], attributes: str | None = None) -> Callable[[Ctx], None]:
    def arm(ctx: Ctx) -> None:
        if attributes:
            (ctx.repo / ".gitattributes").write_text(attributes)
            ctx.git("add", ".gitattributes")
            ctx.git("commit", "-q", "-m", "attributes", "--", ".gitattributes")
        ctx.git("config", key, value_of(ctx))
        os.utime(ctx.repo / ".git" / "index", (1, 1))  # every entry racily clean: git re-reads contents
    return arm


def with_setup(setup: Callable[[Ctx], object], then: Callable[[Ctx], Run | tuple[Run, str | None]]) -> Callable[[Ctx], Run | tuple[Run, str | None]]:
    def run(ctx: Ctx) -> Run | tuple[Run, str | None]:
        setup(ctx)
        return then(ctx)
    return run


GIT_MECHANISMS: dict[str, Callable[[Ctx], None]] = {
    "core.fsmonitor": arm_config("core.fsmonitor", lambda c: c.marker_cmd("fsmonitor")),
    "filter smudge": arm_config("filter.evil.smudge", lambda c: c.marker_cmd("smudge"), "*.py filter=evil\n"),
    "filter clean (required)": lambda c: (arm_config("filter.evil.clean", lambda c: c.marker_cmd("clean"), "*.py filter=evil\n")(c),
                                          c.git("config", "filter.evil.required", "true")),
    "filter process": arm_config("filter.evil.process", lambda c: c.marker_cmd("process"), "*.py filter=evil\n"),
    "diff textconv": arm_config("diff.evil.textconv", lambda c: c.marker_cmd("textconv"), "*.py diff=evil\n"),
    "diff.external": arm_config("diff.external", lambda c: c.marker_cmd("extdiff")),
    "diff driver command": arm_config("diff.evil.command", lambda c: c.marker_cmd("diffcmd"), "*.py diff=evil\n"),
    "core.hooksPath": lambda c: _hooks(c),
    "core.pager+sshCommand+askPass": lambda c: [c.git("config", k, c.marker_cmd(k.replace(".", "-"))) for k in
                                                ("core.pager", "core.sshCommand", "core.askPass", "credential.helper",
                                                 "gpg.program", "core.editor")],
    "include.path -> fsmonitor": lambda c: _include(c),
    "merge driver": arm_config("merge.evil.driver", lambda c: c.marker_cmd("merge"), "*.py merge=evil\n"),
}


def _hooks(ctx: Ctx) -> None:
    hooks = ctx.root / "hooks"
    hooks.mkdir()
    for name in ("post-checkout", "post-index-change", "reference-transaction", "pre-auto-gc", "fsmonitor-watchman",
                 "post-merge", "pre-commit"):
        for where in (hooks, ctx.repo / ".git" / "hooks"):
            (where / name).write_text(f"#!/bin/sh\ntouch '{ctx.markers}/hook-{name}'\n")
            (where / name).chmod(0o755)
    ctx.git("config", "core.hooksPath", str(hooks))


def _include(ctx: Ctx) -> None:
    inc = ctx.root / "included.gitconfig"
    inc.write_text(f"[core]\n\tfsmonitor = {ctx.marker_cmd('included-fsmonitor')}\n")
    ctx.git("config", "include.path", str(inc))
    os.utime(ctx.repo / ".git" / "index", (1, 1))


def _upstream_clone_filter(ctx: Ctx) -> Run:
    clone = ctx.root / "vllm-clone"
    shutil.copytree(UPSTREAM, clone)
    (clone / ".gitattributes").write_text("*.py filter=evil\n")
    ctx.git("init", "-q", "-b", "main", cwd=clone)
    ctx.git("add", "-A", cwd=clone)
    ctx.git("commit", "-q", "-m", "u", cwd=clone)
    ctx.git("config", "filter.evil.smudge", ctx.marker_cmd("upstream-smudge"), cwd=clone)
    ctx.git("config", "core.fsmonitor", ctx.marker_cmd("upstream-fsmonitor"), cwd=clone)
    return tool(ctx, ["review", "--upstream", f"{clone}@HEAD", "--output-dir", str(ctx.out), "--format", "json"])


def _core_worktree(ctx: Ctx) -> tuple[Run, str | None]:
    """core.worktree pointing outside: the review must not read files of that other tree as the port's."""
    elsewhere = ctx.root / "elsewhere"
    (elsewhere / "vllm_metax").mkdir(parents=True)
    (elsewhere / "vllm_metax" / "secret_outside.py").write_text("SECRET = 1\n")
    ctx.git("config", "core.worktree", str(elsewhere))
    run = tool(ctx, ctx.review_args("--worktree"))
    ctx.git("config", "--unset", "core.worktree")
    try:
        seen = {f["path"] for f in json.loads((ctx.out / "report.json").read_text())["files"]}
    except (OSError, ValueError, KeyError):
        seen = set()
    return run, ("read a file of core.worktree's other tree" if "vllm_metax/secret_outside.py" in seen else None)


def name_attack(name: str) -> Callable[[Ctx], Run]:
    def run(ctx: Ctx) -> Run:
        rel = f"vllm_metax/v1/attention/backends/{name}"
        path = ctx.repo.joinpath(*rel.split("/"))
        path.write_text("import torch\n\n\ndef forward(x):\n    return torch.relu(x)\n")
        ctx.git("add", "--", rel)
        return tool(ctx, ctx.review_args("--staged", fmt="md,json,sarif,junit"))
    return run


def deep_dir(base: Path, depth: int, leaf: str = "x.py") -> None:
    base.mkdir(parents=True, exist_ok=True)
    fd = os.open(base, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        nfd = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    f = os.open(leaf, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(f, b"X = 1\n")
    os.close(f)
    os.close(fd)


def dead_pid() -> int:
    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(p.stdout)


def _fifo(ctx: Ctx, name: str = "fifo") -> Path:
    path = ctx.root / name
    os.mkfifo(path)
    return path


def _write(ctx: Ctx, name: str, text: str) -> Path:
    path = ctx.root / name
    path.write_text(text)
    return path


def _signal(sig: int, after: float) -> Callable[[Ctx], tuple[Run, str | None]]:
    def run(ctx: Ctx) -> tuple[Run, str | None]:
        proc = subprocess.Popen([sys.executable, "-m", "metax_audit", *ctx.review_args("--staged", "--test", "sleep 20")],
                                cwd=ctx.repo, env=ctx.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(after)
        proc.send_signal(sig)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            return Run(None, "", "", timed_out=True), None
        code = proc.returncode
        if sig == signal.SIGKILL:  # the next run reclaims what it left
            again = tool(ctx, ctx.review_args("--worktree"))
            return again, None
        return Run(code if code >= 0 else 128 - code, out, err), None
    return run


def cache_attack(corrupt: Callable[[Path], int]) -> Callable[[Ctx], tuple[Run, str | None]]:
    """Warm the cache, corrupt its entries, review again: findings must equal a --no-cache review."""
    def run(ctx: Ctx) -> tuple[Run, str | None]:
        warm = tool(ctx, ctx.review_args("--staged", fmt="json"))
        if warm.code not in (0, 1):
            return warm, "warm-up review failed"
        hit = corrupt(ctx.cache)
        if hit == 0:
            return warm, "harness: nothing in the cache to corrupt"
        got = tool(ctx, ctx.review_args("--staged", fmt="json"))
        findings = findings_of(ctx.out)
        fresh_out = ctx.root / "fresh"
        fresh = tool(ctx, ctx.review_args("--staged", "--no-cache", out=fresh_out, fmt="json"))
        if fresh.code != got.code:
            return got, f"exit {got.code} with a corrupted cache, {fresh.code} with --no-cache"
        if findings != findings_of(fresh_out):
            return got, "findings differ from --no-cache"
        return got, None
    return run


def _entries(cache: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(cache):
        dirnames[:] = [d for d in dirnames if d not in ("upstream", "reports", "snapshots", "kept")]
        out += [Path(dirpath, n) for n in filenames if not n.startswith(("lock", "."))]
    return sorted(p for p in out if p.is_file() and not p.is_symlink())


def _flip(seed: int) -> Callable[[Path], int]:
    def corrupt(cache: Path) -> int:
        import random

        rnd = random.Random(seed)
        entries = _entries(cache)
        for p in entries:
            data = bytearray(p.read_bytes())
            if not data:
                continue
            for _ in range(3):
                i = rnd.randrange(len(data))
                data[i] = rnd.choice(b"abcdefghijklmnopqrstuvwxyz0123456789")
            p.write_bytes(bytes(data))
        return len(entries)
    return corrupt


def _truncate(cache: Path) -> int:
    entries = _entries(cache)
    for p in entries:
        data = p.read_bytes()
        p.write_bytes(data[: len(data) // 2])
    return len(entries)


def _garbage(cache: Path) -> int:
    entries = _entries(cache)
    for i, p in enumerate(entries):
        p.write_bytes(os.urandom(64 + i) if i % 2 else b"\xff" * 4096)
    return len(entries)


def _fifo_links(cache: Path) -> int:
    entries = _entries(cache)
    fifo = cache / "the-fifo"
    os.mkfifo(fifo)
    for p in entries:
        p.unlink()
        os.symlink(fifo, p)
    return len(entries)


def _pickles(cache: Path) -> int:
    import pickle

    entries = _entries(cache)
    for p in entries:
        p.write_bytes(pickle.dumps({"findings": ["planted"]}))
    return len(entries)


def _empty(cache: Path) -> int:
    entries = _entries(cache)
    for p in entries:
        p.write_bytes(b"")
    return len(entries)


def _dirs(cache: Path) -> int:
    entries = _entries(cache)
    for p in entries:
        p.unlink()
        p.mkdir()
    return len(entries)


def _concurrent(n: int) -> Callable[[Ctx], tuple[Run, str | None]]:
    def run(ctx: Ctx) -> tuple[Run, str | None]:
        outs = [ctx.root / f"out{i}" for i in range(n)]
        procs = [subprocess.Popen([sys.executable, "-m", "metax_audit", *ctx.review_args("--staged", out=o, fmt="json")],
                                  cwd=ctx.repo, env=ctx.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for o in outs]
        results = []
        for p in procs:
            out, err = p.communicate(timeout=TIMEOUT)
            results.append(Run(p.returncode, out, err))
        fresh_out = ctx.root / "fresh"
        tool(ctx, ctx.review_args("--staged", "--no-cache", out=fresh_out, fmt="json"))
        want = findings_of(fresh_out)
        bad = [i for i, o in enumerate(outs) if findings_of(o) != want]
        worst = next((r for r in results if r.code not in (0, 1) or "Traceback" in r.stderr), results[0])
        return worst, (f"{len(bad)} of {n} concurrent reviews differ from --no-cache" if bad else None)
    return run


def attacks() -> list[Attack]:
    out: list[Attack] = []
    modes = {"staged": ("--staged",), "worktree": ("--worktree",), "rev HEAD": ("--rev", "HEAD"),
             "merge-base": ("--rev", "HEAD", "--merge-base", "main")}
    for mech, arm in GIT_MECHANISMS.items():
        for mode, flags in modes.items():
            if mode == "merge-base" and mech not in ("core.fsmonitor", "filter clean (required)", "core.hooksPath"):
                continue
            out.append(Attack(f"git config {mech} during {mode}", "git-config", with_setup(arm, review(*flags))))
    out.append(Attack("git config: upstream PATH@REV clone with smudge filter and fsmonitor", "git-config", _upstream_clone_filter))
    out.append(Attack("git config: core.worktree pointing outside the repo", "git-config", _core_worktree, expect=(0, 1, 2),
                      check_repo=False))

    names = {
        "backtick + <img onerror>": "a`<img src=x onerror=alert(1)>`b.py",
        "double backticks + img": "``<img src=x onerror=alert(2)>``.py",
        "leading backtick + svg": "`<svg onload=alert(3)>.py",
        "pipes and <b>": "x|y<b>|z.py",
        "markdown link javascript:": "[x](javascript:alert(4)).py",
        "240-character name": "t" * 236 + ".py",
        "254-byte name": "u" * 251 + ".py",
        "multibyte 250-byte name": "é" * 123 + ".py",
        "newline in name": "new\nline.py",
        "ESC and BEL": "evil\x1b[31mred\x07.py",
        "bidi override": "abc\u202eyp.exe.py",
        "leading dash": "-rf.py",
        "spaces and quotes": "a b 'c' \"d\".py",
        "html entity": "&lt;img&gt;.py",
        "percent-encoded slash": "a%2Fb.py",
        "flattens like another path": "backends__flashinfer.py",
        "only dots": "....py",
        "hash and question mark": "a#b?c.py",
        "non-UTF-8 byte": "bad\udcff.py",
    }
    for label, name in names.items():
        out.append(Attack(f"file name: {label}", "names", name_attack(name)))

    def deep_worktree(depth: int, mode: str) -> Callable[[Ctx], Run]:
        def run(ctx: Ctx) -> Run:
            deep_dir(ctx.repo / "vllm_metax" / "v1" / "attention", depth)
            if mode == "--staged":
                ctx.git("add", "-A")
            return tool(ctx, ctx.review_args(mode))
        return run

    for depth in (1200, 2000):
        for mode in ("--worktree", "--staged"):
            out.append(Attack(f"depth: {depth}-deep directory in the port ({mode})", "depth", deep_worktree(depth, mode)))

    def deep_leftover(ctx: Ctx) -> Run:
        deep_dir(ctx.tmp / f"metax-audit-trash-{dead_pid()}-abcdefgh", 2500)
        deep_dir(ctx.tmp / f"metax-audit-snap-{dead_pid()}-abcdefgh", 2500)
        return tool(ctx, ctx.review_args("--worktree"))

    def deep_stage_leftover(ctx: Ctx) -> Run:
        deep_dir(ctx.out / f"metax-audit-report-{dead_pid()}-zzzz", 2500)
        return tool(ctx, ctx.review_args("--worktree"))

    def deep_python(ctx: Ctx) -> Run:
        p = ctx.repo / "vllm_metax" / "v1" / "attention" / "backends" / "deep_expr.py"
        p.write_text("X = " + "(" * 5000 + "1" + ")" * 5000 + "\n" + "Y = " + "-" * 20000 + "1\n")
        ctx.git("add", "-A")
        return tool(ctx, ctx.review_args("--staged"))

    def deep_classes(ctx: Ctx) -> Run:
        p = ctx.repo / "vllm_metax" / "v1" / "attention" / "backends" / "deep_nest.py"
        p.write_text("".join("    " * i + f"class C{i}:\n" for i in range(90)) + "    " * 90 + "pass\n")
        ctx.git("add", "-A")
        return tool(ctx, ctx.review_args("--staged"))

    def deep_kept_cache(ctx: Ctx) -> Run:  # the kept snapshot (under the cache dir) meets the deep tree twice
        deep_dir(ctx.repo / "vllm_metax" / "v1" / "attention", 1500)
        tool(ctx, ctx.review_args("--worktree"))
        return tool(ctx, ctx.review_args("--worktree"))

    out += [Attack("depth: 2,500-deep leftovers of a killed run in TMPDIR", "depth", deep_leftover),
            Attack("depth: 2,500-deep report staging left in the output dir", "depth", deep_stage_leftover),
            Attack("depth: 5,000-deep expression and a 20,000-long unary chain", "depth", deep_python),
            Attack("depth: 90 nested classes", "depth", deep_classes),
            Attack("depth: 1,500-deep tree reviewed twice (kept snapshot)", "depth", deep_kept_cache)]

    fifo_inputs = [("--waivers", "waivers FIFO"), ("--config", "config FIFO"), ("--stack", "stack manifest FIFO")]
    for flag, label in fifo_inputs:
        out.append(Attack(f"fifo: {label}", "fifo", lambda ctx, flag=flag: tool(ctx, ctx.review_args(flag, str(_fifo(ctx)))),
                          expect=(2,)))
        out.append(Attack(f"device: {flag} /dev/zero", "fifo", lambda ctx, flag=flag: tool(ctx, ctx.review_args(flag, "/dev/zero")),
                          expect=(2,)))

    def repo_fifo(name: str) -> Callable[[Ctx], Run]:
        def run(ctx: Ctx) -> Run:
            target = ctx.repo / name
            if target.exists():
                target.unlink()
            os.mkfifo(target)
            return tool(ctx, ctx.review_args("--worktree"))
        return run

    out += [Attack("fifo: the repo's .metax-audit.yaml is a FIFO", "fifo", repo_fifo(".metax-audit.yaml"), expect=(2,),
                   check_repo=False),
            Attack("fifo: the repo's pyproject.toml is a FIFO", "fifo", repo_fifo("pyproject.toml"), expect=(2,), check_repo=False),
            Attack("fifo: an untracked .py FIFO in scope (--worktree)", "fifo",
                   repo_fifo("vllm_metax/v1/attention/backends/pipe.py"), check_repo=False)]

    def upstream_fifo(ctx: Ctx) -> Run:
        up = ctx.root / "up"
        shutil.copytree(UPSTREAM, up)
        os.mkfifo(up / "vllm" / "v1" / "attention" / "backends" / "pipe.py")
        return tool(ctx, ["review", "--upstream", str(up), "--output-dir", str(ctx.out), "--format", "json"])

    def waivers_out_fifo(ctx: Ctx) -> Run:
        return tool(ctx, ctx.review_args("--generate-waivers", str(_fifo(ctx, "gen.yaml"))))

    out += [Attack("fifo: a FIFO .py in the --upstream directory", "fifo", upstream_fifo),
            Attack("fifo: --generate-waivers names a FIFO", "fifo", waivers_out_fifo)]

    def out_symlink(ctx: Ctx) -> tuple[Run, str | None]:
        real = ctx.root / "real"
        real.mkdir()
        os.symlink(real, ctx.root / "link")
        run = tool(ctx, ctx.review_args(out=ctx.root / "link"))
        return run, (None if "a symlink" in run.stdout.splitlines()[0] else "a symlinked --output-dir was not said")

    def out_links_inside(ctx: Ctx) -> tuple[Run, str | None]:
        ctx.out.mkdir()
        victim = ctx.root / "victim.txt"
        victim.write_text("precious\n")
        os.symlink(victim, ctx.out / "summary.md")
        os.symlink(ctx.root, ctx.out / "files")
        run = tool(ctx, ctx.review_args())
        return run, (None if victim.read_text() == "precious\n" else "wrote through a symlink")

    def out_foreign(ctx: Ctx) -> tuple[Run, str | None]:
        (ctx.out / "files").mkdir(parents=True)
        (ctx.out / "files" / "mine.md").write_text("mine\n")
        (ctx.out / "summary.md").write_text("# our team summary\n")
        run = tool(ctx, ctx.review_args())
        kept = (ctx.out / "files" / "mine.md").exists() and (ctx.out / "summary.md").read_text() == "# our team summary\n"
        return run, (None if kept else "deleted or replaced a file that is not ours")

    def out_foreign_pages_only(ctx: Ctx) -> tuple[Run, str | None]:
        (ctx.out / "files").mkdir(parents=True)
        (ctx.out / "files" / "mine.md").write_text("mine\n")
        run = tool(ctx, ctx.review_args())
        return run, (None if (ctx.out / "files" / "mine.md").exists() else "deleted a page that is not ours")

    def out_files_is_file(ctx: Ctx) -> tuple[Run, str | None]:
        ctx.out.mkdir()
        (ctx.out / "files").write_text("data\n")
        run = tool(ctx, ctx.review_args())
        return run, (None if (ctx.out / "files").read_text() == "data\n" else "replaced a file named files")

    def out_in_repo(ctx: Ctx) -> Run:
        return tool(ctx, ctx.review_args("--worktree", out=ctx.repo / "reports"))

    out += [Attack("output dir: a symlink to another directory", "output-dir", out_symlink),
            Attack("output dir: summary.md and files/ are symlinks out", "output-dir", out_links_inside),
            Attack("output dir: holds a foreign summary.md and page", "output-dir", out_foreign, expect=(2,)),
            Attack("output dir: holds a foreign files/mine.md", "output-dir", out_foreign_pages_only),
            Attack("output dir: files is a regular file", "output-dir", out_files_is_file, expect=(2,)),
            Attack("output dir: /sys (read-only)", "output-dir", lambda ctx: tool(ctx, ctx.review_args(out=Path("/sys"))),
                   expect=(2,)),
            Attack("output dir: an existing regular file", "output-dir",
                   lambda ctx: tool(ctx, ctx.review_args(out=_write(ctx, "afile", "x\n"))), expect=(2,)),
            Attack("output dir: /proc/self", "output-dir", lambda ctx: tool(ctx, ctx.review_args(out=Path("/proc/self"))),
                   expect=(2,)),
            Attack("output dir: inside the audited repo (--worktree)", "output-dir", out_in_repo, check_repo=False)]

    for suffix in (">&-", "2>&-", ">&- 2>&-", "| head -1", ">/dev/full", "<&-"):
        for fail_on, want in (("never", (0,)), ("warning", (1,))):
            out.append(Attack(f"stream: {suffix} with --fail-on {fail_on}", "streams",
                              review("--fail-on", fail_on, suffix=suffix), expect=want))
        out.append(Attack(f"stream: {suffix} with a bad flag", "streams",
                          lambda ctx, s=suffix: tool(ctx, ["review", "--no-such-flag"], shell_suffix=s), expect=(2,)))
    out.append(Attack("stream: --help | head -1", "streams", lambda ctx: tool(ctx, ["--help"], shell_suffix="| head -1"),
                      expect=(0,)))

    out += [Attack("signal: SIGINT during the review", "signals", _signal(signal.SIGINT, 1.5), expect=(130,)),
            Attack("signal: SIGTERM during the review", "signals", _signal(signal.SIGTERM, 1.5), expect=(143, 130)),
            Attack("signal: SIGKILL, then a later review", "signals", _signal(signal.SIGKILL, 1.5)),
            Attack("signal: SIGHUP during the review", "signals", _signal(signal.SIGHUP, 1.5), expect=(129, 130, 143))]

    deep_yaml = "scope: " + "[" * 5000 + "]" * 5000 + "\n"
    deep_block = "".join(" " * i + "a:\n" for i in range(5000))
    deep_toml = "[tool.metax-audit]\nscope = " + "[" * 5000 + "]" * 5000 + "\n"
    bad_values = {
        "--python /tmp": ("--python", "/tmp"), "--python /etc/passwd": ("--python", "/etc/passwd"),
        "--python missing": ("--python", "/nonexistent/python"), "--python /dev/null": ("--python", "/dev/null"),
        "--upstream missing dir": ("--upstream", "/nonexistent"), "--rev unknown": ("--rev", "no-such-rev"),
        "--format bogus": ("--format", "bogus"), "--fail-on bogus": ("--fail-on", "bogus"),
        "--baseline unknown": ("--staged", "--baseline", "no-such-rev"), "--merge-base unknown": ("--rev", "HEAD", "--merge-base", "nobranch"),
        "--repo missing": ("--repo", "/nonexistent"), "--repo not a repo": ("--repo", "/etc"),
        "--output-dir empty": ("--output-dir", ""), "--timeout negative": ("--timeout", "-5"),
        "--introspect-timeout zero": ("--introspect-timeout", "0"),
    }
    for label, flags in bad_values.items():
        out.append(Attack(f"bad flag: {label}", "bad-input", review(*flags), expect=(2,)))
    files = {
        "--config 5,000-deep flow YAML": ("--config", "deep.yaml", deep_yaml),
        "--config 5,000-deep block YAML": ("--config", "deepb.yaml", deep_block),
        "--config 5,000-deep TOML": ("--config", "deep.toml", deep_toml),
        "--waivers 5,000-deep YAML": ("--waivers", "deepw.yaml", deep_yaml),
        "--stack 100,000-deep JSON": ("--stack", "deep.json", '{"schema": ' + "[" * 100000 + "]" * 100000 + "}"),
        "--stack garbage": ("--stack", "garbage.json", "\x00\xff garbage"),
        "--config unknown key": ("--config", "unknown.yaml", "no-such-key: 1\n"),
        "--config scope leaves the repo": ("--config", "leave.yaml", "scope: ['../../etc/*']\n"),
        "--config absolute scope": ("--config", "abs.yaml", "scope: ['/etc/*']\n"),
        "--config huge integer": ("--config", "int.yaml", "port-package: " + "9" * 5000 + "\n"),
        "--config billion laughs": ("--config", "laughs.yaml", "a: &a ['x','x','x','x','x','x','x','x','x']\n"
                                    + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)}]\n" for i in range(8))
                                    + "scope: *i\n"),
        "--waivers not a list": ("--waivers", "w.yaml", "waivers: 3\n"),
        "--waivers python tag": ("--waivers", "tag.yaml", "- !!python/object/apply:os.system ['touch /tmp/pwned-sweep']\n"),
        "--config python tag": ("--config", "tag2.yaml", "scope: !!python/object/apply:os.system ['touch /tmp/pwned-sweep']\n"),
        "--config not UTF-8": ("--config", "latin.yaml", "scope: ['\xe9']\n".encode("latin-1").decode("latin-1")),
    }
    for label, (flag, name, text) in files.items():
        def run(ctx: Ctx, flag: str = flag, name: str = name, text: str = text) -> Run:
            p = ctx.root / name
            if name == "latin.yaml":
                p.write_bytes(b"scope: ['\xe9']\n")
            else:
                p.write_text(text)
            return tool(ctx, ctx.review_args(flag, str(p)))
        out.append(Attack(f"bad input: {label}", "bad-input", run, expect=(2,)))
    def empty_repo(ctx: Ctx) -> Run:
        (ctx.root / "empty").mkdir()
        ctx.git("init", "-q", cwd=ctx.root / "empty")
        return tool(ctx, ctx.review_args(), cwd=ctx.root / "empty")

    out.append(Attack("bad input: a repo with no commits and nothing staged", "bad-input", empty_repo, expect=(2,)))

    for label, corrupt in (("3-byte flips (seed 1)", _flip(1)), ("3-byte flips (seed 2)", _flip(2)),
                           ("3-byte flips (seed 3)", _flip(3)), ("truncated entries", _truncate),
                           ("garbage entries", _garbage), ("entries are symlinks to a FIFO", _fifo_links),
                           ("entries are pickles", _pickles), ("empty entries", _empty),
                           ("entries are directories", _dirs)):
        out.append(Attack(f"cache: {label} vs --no-cache", "cache", cache_attack(corrupt)))
    out.append(Attack("cache: 4 concurrent reviews on one cache vs --no-cache", "cache", _concurrent(4)))

    def cache_is_file(ctx: Ctx) -> Run:
        ctx.cache.parent.mkdir(parents=True, exist_ok=True)
        ctx.cache.write_text("not a dir\n")
        return tool(ctx, ctx.review_args())

    out.append(Attack("cache: METAX_AUDIT_CACHE is a regular file", "cache", cache_is_file, expect=(0, 1, 2)))

    def leftover_snap(ctx: Ctx) -> Run:
        (ctx.tmp / f"metax-audit-snap-{dead_pid()}-abcdefgh" / "pkg").mkdir(parents=True)
        (ctx.tmp / "someone-elses").mkdir()
        run = tool(ctx, ctx.review_args())
        if not (ctx.tmp / "someone-elses").is_dir():
            run = Run(run.code, run.stdout, run.stderr + "\nremoved someone else's directory")
        (ctx.tmp / "someone-elses").rmdir()
        return run

    def leftover_link(ctx: Ctx) -> tuple[Run, str | None]:
        victim = ctx.root / "victim"
        victim.mkdir()
        (victim / "keep").write_text("x")
        os.symlink(victim, ctx.tmp / f"metax-audit-snap-{dead_pid()}-linked")
        run = tool(ctx, ctx.review_args())
        broke = None if (victim / "keep").exists() else "followed a symlinked leftover"
        for p in ctx.tmp.glob("metax-audit-snap-*-linked"):
            p.unlink()
        return run, broke

    out += [Attack("leftover: a killed run's snapshot and a foreign dir in TMPDIR", "leftovers", leftover_snap),
            Attack("leftover: a symlinked leftover pointing at a victim", "leftovers", leftover_link)]
    return out


def make_ctx(base: Path, template: Path) -> Ctx:
    root = Path(tempfile.mkdtemp(prefix="sweep-", dir=base))
    repo = root / "port"
    shutil.copytree(template, repo, symlinks=True)
    for d in ("tmp", "markers"):
        (root / d).mkdir()
    return Ctx(root=root, repo=repo, tmp=root / "tmp", cache=root / "cache", out=root / "out", markers=root / "markers")


def _rm(path: Path) -> None:
    subprocess.run(["rm", "-rf", str(path)], check=False)  # deep trees: rm is iterative


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="run the attacks whose name contains this")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="metax-sweep-"))
    template = demo.build_demo_repo(base / "template")
    chosen = [a for a in attacks() if args.only in a.name]
    results: list[dict[str, str]] = []

    def one(attack: Attack) -> dict[str, str]:
        ctx = make_ctx(base, template)
        try:
            verdict, detail = judge(attack, ctx)
        finally:
            _rm(ctx.root)
        return {"attack": attack.name, "group": attack.group, "result": verdict, "detail": detail}

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for res in pool.map(one, chosen):
            results.append(res)
            print(f"{res['result']:5}  {res['attack']} -> {res['detail']}", flush=True)
    _rm(base)
    broke = [r for r in results if r["result"] != "held"]
    print(f"\n{len(results)} attacks: {len(results) - len(broke)} held, {len(broke)} broke")
    if Path("/tmp/pwned-sweep").exists():
        print("!! /tmp/pwned-sweep exists: a YAML tag ran code")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
