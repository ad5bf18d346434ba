# Hardening, round 2 (issue 31): what the audited repository configures never runs, deep trees and
# leftovers never break a run, closed streams keep the exit code, FIFOs never hang, names never break
# a report, bad input and hostile output dirs are one line and exit 2. Each test names its attack.
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import git

from metax_audit import demo

PROJECT = Path(__file__).resolve().parents[1]


def run_tool(cwd: Path, *args: str, env: dict[str, str] | None = None, **kw: object) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(PROJECT), "CI": "1", "COLUMNS": "500", **(env or {})}
    full.pop("PYTHONSAFEPATH", None)
    kw.setdefault("timeout", 300)
    return subprocess.run([sys.executable, "-m", "metax_audit", *args], cwd=cwd, env=full,  # type: ignore[call-overload]
                          capture_output=True, text=True, **kw)


def review_args(out: Path, *extra: str) -> list[str]:
    return ["review", "--upstream", str(demo.upstream_root()), "--output-dir", str(out), "--format", "json,md,sarif",
            "--fail-on", "never", *extra]


def one_line_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("metax-audit: error: "), err
    assert "Traceback" not in err and "internal error" not in err, err
    return lines[0]


@pytest.fixture()
def demo_repo(tmp_path: Path) -> Path:
    return demo.build_demo_repo(tmp_path / "port")


# ---------------------------------------------------------------- 1. repo-configured code never runs


def marker_script(tmp_path: Path, name: str) -> tuple[str, Path]:
    """A shell command that touches <markers>/<name> and passes stdin through (a filter must)."""
    markers = tmp_path / "markers"
    markers.mkdir(exist_ok=True)
    script = tmp_path / f"run-{name}.sh"
    script.write_text(f"#!/bin/sh\ntouch '{markers}/{name}'\ncat\n")
    script.chmod(0o755)
    return str(script), markers


def arm(repo: Path, tmp_path: Path, mechanism: str) -> Path:
    """Configure `mechanism` in the demo repo so that git would run a marker-writing command; the
    attributes naming a driver are committed (the revision review reads them) and staged."""
    cmd, markers = marker_script(tmp_path, mechanism)
    if mechanism in ("filter", "textconv", "extdiff"):
        attr = {"filter": "filter=evil", "textconv": "diff=evil", "extdiff": "diff=evil"}[mechanism]
        (repo / ".gitattributes").write_text(f"*.py {attr}\n*.txt {attr}\n")
        git(repo, "add", ".gitattributes")
        git(repo, "commit", "-q", "-m", "attributes", "--", ".gitattributes")
    if mechanism == "fsmonitor":
        git(repo, "config", "core.fsmonitor", cmd)
    elif mechanism == "filter":
        for var in ("clean", "smudge"):
            git(repo, "config", f"filter.evil.{var}", cmd)
        git(repo, "config", "filter.evil.required", "true")
    elif mechanism == "filter-process":
        (repo / ".gitattributes").write_text("*.py filter=proc\n")
        git(repo, "add", ".gitattributes")
        git(repo, "commit", "-q", "-m", "attributes", "--", ".gitattributes")
        git(repo, "config", "filter.proc.process", cmd)
        git(repo, "config", "filter.proc.required", "true")
    elif mechanism == "textconv":
        git(repo, "config", "diff.evil.textconv", cmd)
    elif mechanism == "extdiff":
        git(repo, "config", "diff.external", cmd)
        git(repo, "config", "diff.evil.command", cmd)
    elif mechanism == "hooks":
        hooks = tmp_path / "hooks"
        hooks.mkdir()
        for name in ("post-checkout", "post-index-change", "reference-transaction", "pre-auto-gc", "post-merge",
                     "pre-commit", "post-rewrite", "fsmonitor-watchman"):
            for where in (hooks, repo / ".git" / "hooks"):
                (where / name).write_text(f"#!/bin/sh\ntouch '{markers}/hook-{name}'\n")
                (where / name).chmod(0o755)
        git(repo, "config", "core.hooksPath", str(hooks))
    elif mechanism == "pager-ssh-askpass":
        for key in ("core.pager", "core.sshCommand", "core.askPass", "credential.helper", "gpg.program",
                    "core.editor", "sequence.editor"):
            git(repo, "config", key, cmd)
    # every entry racily clean: git compares contents (running a clean filter) instead of trusting stat
    os.utime(repo / ".git" / "index", (1, 1))
    return markers


MECHANISMS = ["fsmonitor", "filter", "filter-process", "textconv", "extdiff", "hooks", "pager-ssh-askpass"]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_nothing_the_audited_repo_configures_runs(tmp_path: Path, demo_repo: Path, mechanism: str) -> None:
    markers = arm(demo_repo, tmp_path, mechanism)
    for mode in (["--staged"], ["--worktree"], ["--rev", "HEAD"], ["--rev", "HEAD", "--merge-base", "main"]):
        r = run_tool(demo_repo, *review_args(tmp_path / "out", *mode))
        assert r.returncode == 0, (mode, r.stderr)
        assert sorted(p.name for p in markers.iterdir()) == [], (mechanism, mode)


def test_an_upstream_clone_s_filter_never_runs(tmp_path: Path, demo_repo: Path) -> None:
    import shutil

    clone = tmp_path / "vllm-clone"
    shutil.copytree(demo.upstream_root(), clone)
    (clone / ".gitattributes").write_text("*.py filter=evil\n")
    git(clone, "init", "-q", "-b", "main")
    git(clone, "add", "-A")
    git(clone, "commit", "-q", "-m", "upstream")
    cmd, markers = marker_script(tmp_path, "upstream-smudge")
    git(clone, "config", "filter.evil.smudge", cmd)
    git(clone, "config", "filter.evil.required", "true")
    r = run_tool(demo_repo, "review", "--upstream", f"{clone}@HEAD", "--output-dir", str(tmp_path / "out"),
                 "--format", "json", "--fail-on", "never")
    assert r.returncode == 0, r.stderr
    assert list(markers.iterdir()) == []


def test_every_git_command_goes_through_the_wrapper() -> None:
    """No module but gitcmd starts git itself (a new call site would miss the safe flags)."""
    offenders = []
    for path in (PROJECT / "metax_audit").rglob("*.py"):
        if path.name == "gitcmd.py":
            continue
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"""\[\s*["']git["']\s*,""", text):
            offenders.append(f"{path.relative_to(PROJECT)}:{text.count(chr(10), 0, m.start()) + 1}")
        if re.search(r"^\s*(import git\b|from git import)", text, re.M):
            offenders.append(f"{path.relative_to(PROJECT)}: GitPython")
    assert offenders == []


# ---------------------------------------------------------------- 2. depth: no recursion, no leftover that breaks a later run


def deep_dir(base: Path, depth: int, leaf: str = "x.py", text: str = "X = 1\n") -> None:
    """`base`/d/d/.../d/`leaf`, `depth` levels, made relative to a descriptor (the absolute path is
    longer than PATH_MAX)."""
    base.mkdir(parents=True, exist_ok=True)
    fd = os.open(base, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            nfd = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        f = os.open(leaf, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(f, text.encode())
        os.close(f)
    finally:
        os.close(fd)


def test_a_2000_deep_directory_in_the_worktree_is_reviewed(tmp_path: Path, demo_repo: Path) -> None:
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    deep_dir(demo_repo / "vllm_metax" / "v1" / "attention", 2000)
    out = tmp_path / "out"
    for mode in ("--worktree", "--staged"):
        r = run_tool(demo_repo, *review_args(out, mode, "--format", "json,md,sarif,junit"), env={"TMPDIR": str(private_tmp)})
        assert r.returncode == 0, r.stderr[-2000:]
        assert "Traceback" not in r.stderr and "RecursionError" not in r.stderr
        assert list(private_tmp.iterdir()) == []  # the snapshot (2,000 deep) is gone
    assert all(len(p.name.encode()) <= 160 for p in (out / "files").iterdir())


def test_a_2000_deep_leftover_of_a_killed_run_never_breaks_a_later_one(tmp_path: Path, demo_repo: Path) -> None:
    private_tmp = tmp_path / "tmp"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    leftover = private_tmp / f"metax-audit-trash-{int(dead.stdout)}-abcdefgh"
    deep_dir(leftover, 2500)
    out = tmp_path / "out"
    deep_dir(out / f"metax-audit-report-{int(dead.stdout)}-zzzzzzzz", 2500)  # a report stage left deep
    r = run_tool(demo_repo, *review_args(out, "--worktree"), env={"TMPDIR": str(private_tmp)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert list(private_tmp.iterdir()) == [] and not [p for p in out.iterdir() if p.name.startswith("metax-audit-")]


def test_fstree_matches_the_stdlib_and_never_recurses(tmp_path: Path) -> None:
    from metax_audit.core import fstree

    root = demo.build_demo_repo(tmp_path / "port")
    os.symlink("v1", root / "vllm_metax" / "linked")
    for pattern in ("vllm_metax/v1/attention/**", "vllm_metax/v1/attention/**/*.py", "**/*.py", "*", "vllm_metax/*/at*/**/f*.py",
                    "vllm_metax/**/backends/*.py", "**/**/*.py", "vllm_metax/linked/**/*.py", "nothing/**", "vllm_metax"):
        assert fstree.glob(root, pattern) == list(root.glob(pattern)), pattern
    assert list(fstree.walk(root)) == list(os.walk(root))
    assert fstree.files(root, ".py") == sorted(p for p in root.rglob("*.py") if p.is_file())
    deep_dir(tmp_path / "deep", 1500)  # deeper than the recursion limit, within PATH_MAX
    assert len(fstree.files(tmp_path / "deep", ".py")) == 1
    assert len(fstree.glob(tmp_path / "deep", "**/*.py")) == 1
    fstree.rmtree(tmp_path / "deep")
    deep_dir(tmp_path / "deep", 5000)  # past PATH_MAX: removed one descriptor at a time
    os.symlink(str(root), tmp_path / "deep" / "d" / "link-out")  # never followed by rmtree
    fstree.rmtree(tmp_path / "deep")
    assert not (tmp_path / "deep").exists() and (root / "vllm_metax").is_dir()


# ---------------------------------------------------------------- 3. names in reports


def _no_raw_html(markdown_text: str) -> None:
    """Rendered as CommonMark + tables (as GitHub does), no HTML tag comes from the text."""
    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark").enable("table").render(markdown_text)
    allowed = {"p", "ul", "ol", "li", "code", "strong", "em", "a", "h1", "h2", "h3", "h4", "table", "thead", "tbody",
               "tr", "th", "td", "pre", "blockquote", "sub", "hr", "br", "details", "summary"}
    tags = {m.group(1).lower() for m in re.finditer(r"<\s*/?\s*([A-Za-z][A-Za-z0-9-]*)", html)}
    assert tags <= allowed, (tags - allowed, html[:2000])


def add_named_file(repo: Path, name: str) -> str:
    rel = f"vllm_metax/v1/attention/backends/{name}"
    (repo / rel).write_text("import torch\n\n\ndef forward(x):\n    return torch.nn.functional.relu(x)\n")
    git(repo, "add", rel)
    return rel


@pytest.mark.parametrize("name", [
    "a`<img src=x onerror=alert(1)>`b.py",
    "``<img src=x onerror=alert(2)>``.py",
    "`<svg onload=alert(3)>.py",
    "x|y<b>|z.py",
    "[link](javascript:alert(4)).py",
    "t" * 236 + ".py",
])
def test_file_names_cannot_break_a_report(tmp_path: Path, demo_repo: Path, name: str) -> None:
    import json
    import xml.etree.ElementTree as ET

    rel = add_named_file(demo_repo, name)
    out = tmp_path / "out"
    r = run_tool(demo_repo, *review_args(out, "--staged", "--format", "json,md,sarif,junit"))
    assert r.returncode == 0, r.stderr
    report = json.loads((out / "report.json").read_text())
    assert rel in {f["path"] for f in report["files"]}
    json.loads((out / "report.sarif").read_text())
    ET.fromstring((out / "report.junit.xml").read_text())
    pages = list((out / "files").iterdir())
    assert all(len(p.name.encode()) <= 160 for p in pages)
    summary = (out / "summary.md").read_text()
    _no_raw_html(summary)
    for page in pages:
        _no_raw_html(page.read_text())
    # every page link of the summary names a page that exists
    from urllib.parse import unquote

    links = {unquote(m) for m in re.findall(r"\]\((files/[^)]+)\)", summary)}
    assert links and all((out / link).is_file() for link in links), links


def test_pages_of_paths_that_flatten_alike_are_distinct() -> None:
    from metax_audit.report.markdown import page_names

    names = page_names(["a/b.py", "a__b.py", "A/b.py", "x/" + "y" * 300 + ".py"])
    assert len(set(n.casefold() for n in names.values())) == 4
    assert names["A/b.py"] == "A__b.py.md" and all(len(n.encode()) <= 160 for n in names.values())


# ---------------------------------------------------------------- 4. closed streams keep the review's exit code


def shell_tool(cwd: Path, args: list[str], redirect: str) -> tuple[int, str]:
    """Run the tool under bash with `redirect` applied (`>&-`, `2>&-`, `| head -1`); its exit code
    and what reached stderr (through a file when stderr is not the one closed)."""
    import shlex

    err = cwd.parent / "stderr.txt"
    cmd = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "metax_audit", *args])
    if redirect.startswith("|"):
        script = f"{cmd} 2>{shlex.quote(str(err))} {redirect}; exit ${{PIPESTATUS[0]}}"
    elif "2>&-" in redirect:
        script = f"{cmd} {redirect}"
    else:
        script = f"{cmd} {redirect} 2>{shlex.quote(str(err))}"
    env = {**os.environ, "PYTHONPATH": str(PROJECT), "CI": "1"}
    env.pop("PYTHONSAFEPATH", None)
    done = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, err.read_text() if err.exists() else ""


@pytest.mark.parametrize("redirect", [">&-", "2>&-", ">&- 2>&-", "| head -1", ">/dev/full"])
def test_closed_streams_keep_the_exit_code(tmp_path: Path, demo_repo: Path, redirect: str) -> None:
    for fail_on, want in (("never", 0), ("warning", 1)):
        args = ["review", "--upstream", str(demo.upstream_root()), "--output-dir", str(tmp_path / "out"),
                "--format", "json", "--fail-on", fail_on]
        code, err = shell_tool(demo_repo, args, redirect)
        assert code == want, (redirect, fail_on, err)
        assert "Traceback" not in err and "internal error" not in err, err
    code, err = shell_tool(demo_repo, ["review", "--no-such-flag"], redirect)
    assert code == 2 and "Traceback" not in err


# ---------------------------------------------------------------- 5. FIFOs, devices and deep nesting in input files; bad flags


def _deep_yaml(tmp: Path) -> Path:
    (tmp / "deep.yaml").write_text("scope: " + "[" * 5000 + "]" * 5000 + "\n")
    return tmp / "deep.yaml"


def _deep_block_yaml(tmp: Path) -> Path:
    (tmp / "deep-block.yaml").write_text("".join(" " * i + "a:\n" for i in range(5000)))
    return tmp / "deep-block.yaml"


def _deep_toml(tmp: Path) -> Path:
    (tmp / "deep.toml").write_text("[tool.metax-audit]\nscope = " + "[" * 5000 + "]" * 5000 + "\n")
    return tmp / "deep.toml"


def _deep_json(tmp: Path) -> Path:
    (tmp / "deep.json").write_text('{"schema": ' + "[" * 100_000 + "]" * 100_000 + "}")
    return tmp / "deep.json"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "fifo.yaml")
    return tmp / "fifo.yaml"


BAD_INPUTS = [
    ("--config", _fifo, "a FIFO"), ("--waivers", _fifo, "a FIFO"), ("--stack", _fifo, "a FIFO"),
    ("--config", lambda t: Path("/dev/zero"), "a device"), ("--waivers", lambda t: Path("/dev/zero"), "a device"),
    ("--stack", lambda t: Path("/dev/zero"), "a device"), ("--config", lambda t: t, "a directory"),
    ("--config", _deep_yaml, "nested too deeply"), ("--config", _deep_block_yaml, "nested too deeply"),
    ("--config", _deep_toml, "nested too deeply"), ("--waivers", _deep_yaml, "nested too deeply"),
    ("--stack", _deep_json, "nested too deeply"),
    ("--python", lambda t: Path("/tmp"), "cannot run"), ("--python", lambda t: Path("/etc/passwd"), "cannot run"),
    ("--config", lambda t: _write(t / "int.yaml", "port-package: " + "9" * 5000 + "\n"), "Exceeds the limit"),
    ("--config", lambda t: _write(t / "int.toml", "[tool.metax-audit]\nport-package = " + "9" * 5000 + "\n"),
     "Exceeds the limit"),
]


@pytest.mark.parametrize(("option", "make", "message"), BAD_INPUTS,
                         ids=[f"{o}-{m}-{i}" for i, (o, _, m) in enumerate(BAD_INPUTS)])
def test_bad_input_files_are_one_line_exit_2(tmp_path: Path, demo_repo: Path, option: str, make: object,
                                             message: str) -> None:
    where = tmp_path / "inputs"
    where.mkdir()
    value = make(where)  # type: ignore[operator]
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    r = run_tool(demo_repo, *review_args(tmp_path / "out", option, str(value)), timeout=120,
                 env={"TMPDIR": str(private_tmp)})
    assert r.returncode == 2, r.stderr
    assert message in one_line_error(r.stderr)
    assert list(private_tmp.iterdir()) == []  # a review that stops early leaves nothing behind


def test_a_fifo_as_the_repo_s_own_config_is_refused_not_skipped(tmp_path: Path, demo_repo: Path) -> None:
    os.mkfifo(demo_repo / ".metax-audit.yaml")
    r = run_tool(demo_repo, *review_args(tmp_path / "out"), timeout=120)
    assert r.returncode == 2 and "a FIFO" in one_line_error(r.stderr)


def test_read_bytes_never_blocks_and_reads_only_regular_files(tmp_path: Path) -> None:
    from metax_audit.core import inputs

    os.mkfifo(tmp_path / "fifo")
    for path in (tmp_path / "fifo", Path("/dev/zero"), tmp_path):
        with pytest.raises(inputs.InputFileError):
            inputs.read_bytes(path)
    (tmp_path / "f.txt").write_bytes(b"a\r\nb")
    os.symlink("f.txt", tmp_path / "link")
    assert inputs.read_text(tmp_path / "f.txt") == "a\nb" and inputs.read_bytes(tmp_path / "link") == b"a\r\nb"
    with pytest.raises(inputs.InputFileError):
        inputs.read_bytes(tmp_path / "link", follow_symlinks=False)


# ---------------------------------------------------------------- 6. the output directory


def test_an_output_dir_that_holds_other_files_keeps_them(tmp_path: Path, demo_repo: Path) -> None:
    out = tmp_path / "out"
    (out / "files").mkdir(parents=True)
    (out / "files" / "notes.md").write_text("# my notes\n")  # a page name of ours by pattern, not ours
    (out / "README.md").write_text("mine\n")
    r = run_tool(demo_repo, *review_args(out))
    assert r.returncode == 0, r.stderr
    assert (out / "files" / "notes.md").read_text() == "# my notes\n" and (out / "README.md").read_text() == "mine\n"
    # our stale page goes when its file leaves the scope; theirs stays
    stale = out / "files" / "vllm_metax__gone.py.md"
    stale.write_text("# `vllm_metax/gone.py`\n\n[back to summary](../summary.md)\n")
    r = run_tool(demo_repo, *review_args(out))
    assert r.returncode == 0 and not stale.exists() and (out / "files" / "notes.md").exists()
    # a summary.md that is not ours is never replaced: exit 2, one line, the file intact
    (out / "summary.md").write_text("# the team's summary\n")
    r = run_tool(demo_repo, *review_args(out))
    assert r.returncode == 2 and "not written by metax-audit" in one_line_error(r.stderr)
    assert (out / "summary.md").read_text() == "# the team's summary\n"
    (out / "summary.md").unlink()
    (out / "files").rename(out / "theirs")
    (out / "files").write_text("a file named files\n")
    r = run_tool(demo_repo, *review_args(out))
    assert r.returncode == 2 and (out / "files").read_text() == "a file named files\n"


def test_a_symlinked_output_dir_is_said_and_bad_ones_are_exit_2(tmp_path: Path, demo_repo: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "link")
    r = run_tool(demo_repo, *review_args(tmp_path / "link"))
    assert r.returncode == 0, r.stderr
    assert f"(a symlink: written into {real})" in r.stdout.splitlines()[0]
    assert (real / "summary.md").is_file()
    for bad in ("/etc/passwd", "/proc/self", "/sys"):
        r = run_tool(demo_repo, *review_args(Path(bad)))
        assert r.returncode == 2 and "output directory" in one_line_error(r.stderr), bad


@pytest.mark.parametrize("option", ["--output-dir", "--config", "--waivers", "--stack", "--repo"])
def test_an_empty_path_option_is_refused_not_the_cwd(tmp_path: Path, demo_repo: Path, option: str) -> None:
    """Path("") is Path("."): an empty --output-dir (an unset CI variable) wrote the reports into the checkout."""
    from conftest import fingerprint

    before = fingerprint(demo_repo)
    for args in ([option, ""], [f"{option}="]):
        r = run_tool(demo_repo, "review", "--upstream", str(demo.upstream_root()), *args)
        assert r.returncode == 2 and f"{option} is empty" in one_line_error(r.stderr)
    assert fingerprint(demo_repo) == before


def test_fifos_in_the_stack_cache_and_kept_snapshot_never_block(tmp_path: Path) -> None:
    """Cache files replaced by FIFOs (or links to one): read as absent, written by rename (both hung)."""
    from metax_audit.cache import kept_snapshot
    from metax_audit.stages.introspect import cache as stack_cache

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    os.symlink(fifo, tmp_path / "facts.json")
    assert stack_cache._read_cache(tmp_path / "facts.json") is None
    os.symlink(fifo, tmp_path / "seen")
    stack_cache._write_marker(tmp_path / "seen")
    assert (tmp_path / "seen").is_file() and not (tmp_path / "seen").is_symlink()
    (tmp_path / "kept").mkdir()
    os.symlink(fifo, tmp_path / "kept" / "manifest")
    assert kept_snapshot._load(tmp_path / "kept", ("x", "y")) is None
