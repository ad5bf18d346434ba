# Attacks a hostile or careless user would try, run on fixtures: each asserts the audited repo is
# byte-identical afterwards, no code of the repo ran (no marker file), and the documented exit code.
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import fingerprint, git, write_tree

from metax_audit import demo
from metax_audit.stages.snapshot import snapshot

PROJECT = Path(__file__).resolve().parents[1]


def run_tool(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m metax_audit ARGS` as a user runs it: from `cwd`, the tool found through PYTHONPATH."""
    full = {**os.environ, "PYTHONPATH": str(PROJECT), "CI": "1", "COLUMNS": "500", **(env or {})}
    full.pop("PYTHONSAFEPATH", None)
    return subprocess.run([sys.executable, "-m", "metax_audit", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=300)


def one_line_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("metax-audit: error: "), err
    assert "Traceback" not in err and "internal error" not in err, err
    return lines[0]


@pytest.fixture()
def demo_repo(tmp_path: Path) -> Path:
    return demo.build_demo_repo(tmp_path / "port")


def review_args(out: Path, *extra: str) -> list[str]:
    return ["review", "--upstream", str(demo.upstream_root()), "--output-dir", str(out), "--format", "json,md",
            *extra]


# ---------------------------------------------------------------- 1. symlinks in the snapshot


@pytest.mark.parametrize("absolute", [False, True], ids=["relative-out-and-back", "absolute"])
def test_symlinked_directory_is_audited_never_followed(tmp_path: Path, demo_repo: Path, absolute: bool) -> None:
    victim = tmp_path / "victimdir"
    ops = demo_repo / "vllm_metax" / "v1" / "attention" / "ops"
    os.rename(ops, victim)
    victim_before = {p.name: p.read_bytes() for p in victim.iterdir()}
    # ops -> ../../../../victimdir leaves the repository and names a real directory outside it
    link = str(victim) if absolute else os.path.relpath(victim, ops.parent)
    os.symlink(link, ops)
    before = fingerprint(demo_repo)
    r = run_tool(demo_repo, *review_args(tmp_path / "out", "--worktree", "--fail-on", "never"))
    assert r.returncode == 0, r.stderr
    assert "internal error" not in r.stderr
    assert fingerprint(demo_repo) == before
    assert {p.name: p.read_bytes() for p in victim.iterdir()} == victim_before
    assert "leaves the repository: recorded, not followed" in r.stdout + r.stderr


def test_snapshot_records_links_and_never_writes_through_them(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    (repo / "pkg").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "pkg" / "a.py").write_text("A = 1\n")
    (repo / "pkg" / "sub").mkdir()
    (repo / "pkg" / "sub" / "b.py").write_text("B = 1\n")
    os.symlink("a.py", repo / "pkg" / "inside.py")
    os.symlink("/etc/hostname", repo / "pkg" / "abs.py")
    os.symlink("../../outside.py", repo / "pkg" / "out.py")
    (tmp_path / "outside.py").write_text("SECRET = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "one")
    for mode, rev in (("staged", None), ("worktree", None), ("rev", "HEAD")):
        with snapshot(mode, repo, rev) as snap:
            root = snap.root
            assert (root / "pkg" / "inside.py").read_text() == "A = 1\n"
            assert not os.path.lexists(root / "pkg" / "abs.py"), mode
            assert not os.path.lexists(root / "pkg" / "out.py"), mode
            assert any("pkg/out.py -> ../../outside.py leaves the repository" in n for n in snap.notes), (mode, snap.notes)
            assert any("pkg/abs.py -> /etc/hostname leaves the repository" in n for n in snap.notes), (mode, snap.notes)
    # a tracked directory replaced by a link: the files below it are not exported, nothing is written there
    os.rename(repo / "pkg" / "sub", tmp_path / "elsewhere")
    os.symlink(str(tmp_path / "elsewhere"), repo / "pkg" / "sub")
    with snapshot("worktree", repo) as snap:
        assert not os.path.lexists(snap.root / "pkg" / "sub")
        assert any(n.startswith("pkg/sub is a symlink in the worktree (-> ") and n.endswith("leaves the repository: recorded, not followed): 1 tracked file(s) below it not exported") for n in snap.notes), snap.notes
    assert sorted(p.name for p in (tmp_path / "elsewhere").iterdir()) == ["b.py"]


def test_place_refuses_paths_leaving_the_snapshot(tmp_path: Path) -> None:
    from metax_audit.core.errors import SnapshotError
    from metax_audit.stages.snapshot import _place

    root = tmp_path / "snap"
    root.mkdir()
    os.symlink(str(tmp_path), root / "link")
    for bad in ("../x.py", "/etc/x.py", "a/../../x.py", "link/x.py", ""):
        with pytest.raises(SnapshotError):
            _place(root, bad)
    assert _place(root, "a/b/c.py") == root / "a" / "b" / "c.py"
    assert (root / "a" / "b").is_dir() and not (tmp_path / "x.py").exists()


# ---------------------------------------------------------------- 2. the user's code never runs

MARKER_CODE = "import pathlib; pathlib.Path({path!r}).write_text('ran')\n"


def plant(repo: Path, marker_dir: Path, *names: str) -> list[Path]:
    """Modules at the repo root that write a marker when imported; returns the markers."""
    markers = []
    for name in names:
        marker = marker_dir / f"ran-{name}"
        (repo / f"{name}.py").write_text(MARKER_CODE.format(path=str(marker)))
        markers.append(marker)
    return markers


def test_shadowing_modules_in_the_repo_never_run(tmp_path: Path, demo_repo: Path) -> None:
    markers = plant(demo_repo, tmp_path, "json", "torch", "sitecustomize", "typing_extensions", "dataclasses")
    before = fingerprint(demo_repo)
    r = run_tool(demo_repo, *review_args(tmp_path / "out", "--worktree", "--fail-on", "never"))
    assert r.returncode == 0, r.stderr
    r = run_tool(demo_repo, "evidence", "--json")
    assert r.returncode == 0, r.stderr
    assert [m for m in markers if m.exists()] == []
    assert fingerprint(demo_repo) == before  # no __pycache__ either


def editable_install(tmp_path: Path, demo_repo: Path) -> tuple[Path, list[Path]]:
    """A venv (over this interpreter's site-packages) with the port installed editable (a .pth naming
    its checkout), a sitecustomize and a torch.py at the repo root and a marker in the port's
    __init__: the venv's python and the markers (sitecustomize's first)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    python = venv / "bin" / "python"
    site_dir = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True).stdout.strip())
    (site_dir / "__editable__.vllm_metax.pth").write_text(str(demo_repo) + "\n")
    markers = plant(demo_repo, tmp_path, "sitecustomize", "torch")
    init = demo_repo / "vllm_metax" / "__init__.py"
    init.write_text(init.read_text() + MARKER_CODE.format(path=str(tmp_path / "ran-port")))
    markers.append(tmp_path / "ran-port")
    return python, markers


def test_editable_install_of_the_port_is_never_imported(tmp_path: Path, demo_repo: Path) -> None:
    """The port installed editable into --python's environment, named among the kernel modules of its
    own config, with a sitecustomize and a torch.py at the repo root: none of it runs."""
    python, markers = editable_install(tmp_path, demo_repo)
    (demo_repo / ".metax-audit.yaml").write_text("kernel-modules: [flashinfer, vllm_metax, torch]\n")
    before = fingerprint(demo_repo)
    r = run_tool(demo_repo, *review_args(tmp_path / "out", "--worktree", "--fail-on", "never", "--python", str(python)))
    assert r.returncode == 0, r.stderr
    assert [m for m in markers if m.exists()] == []
    assert fingerprint(demo_repo) == before
    # the fence is what held: the same interpreter without it does run the repo's sitecustomize
    subprocess.run([str(python), "-c", "pass"], cwd=tmp_path, check=True)
    assert markers[0].exists()


def test_evidence_and_probe_workers_stand_behind_the_port_fence(tmp_path: Path, demo_repo: Path) -> None:
    """The evidence worker and a probe worker of a kernel target, in an interpreter where the port is
    installed editable with a sitecustomize in its checkout: neither the port nor the checkout's
    modules run; the evidence still reads the interpreter's packages. A probe of the port's own code
    (asked for by name) does import it."""
    python, markers = editable_install(tmp_path, demo_repo)
    before = fingerprint(demo_repo)
    r = run_tool(tmp_path, "evidence", "--json", "--python", str(python))
    assert r.returncode == 0, r.stderr
    assert '"torch"' in r.stdout and str(python.parent.parent) in r.stdout
    r = run_tool(tmp_path, "probe", "--target", "torch-reference", "--family", "paged-decode", "--probes", "lse",
                 "--device", "cpu", "--python", str(python), "--output-dir", str(tmp_path / "probes"))
    # the checkout's torch.py comes first on that interpreter's path: the fence refuses it, and says so
    assert r.returncode == 1, r.stderr
    assert "torch comes from the port's checkout" in (tmp_path / "probes" / "probes.md").read_text()
    assert [m for m in markers if m.exists()] == []
    assert fingerprint(demo_repo) == before
    r = run_tool(tmp_path, "probe", "--target", "vllm_metax:no_such_kernel", "--family", "paged-decode", "--probes", "lse",
                 "--device", "cpu", "--python", str(python), "--output-dir", str(tmp_path / "probes"))
    assert r.returncode == 2 and "no_such_kernel" in r.stderr, r.stderr
    assert (tmp_path / "ran-port").exists()  # asked for by name: the port's own code is what runs


def test_metadata_queries_in_the_target_interpreter_run_no_customize_module(tmp_path: Path, demo_repo: Path) -> None:
    """The installed-versions query (stack pins) and the installed-distribution query (--installed)
    run in --python's interpreter behind the fence: the checkout's sitecustomize never runs there,
    and the answers are still read from that interpreter's metadata."""
    from metax_audit.stages import snapshot as snapshot_mod
    from metax_audit.stages.introspect.stack_pins import installed_versions

    python, markers = editable_install(tmp_path, demo_repo)
    # a distribution of the inner venv's own: with --system-site-packages a venv sees the base interpreter's
    # site-packages, not those of the venv the tests run in (README's fresh venv), so pytest may be absent there
    site_dir = Path(subprocess.run([str(python), "-S", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True).stdout.strip())  # -S: no .pth, no sitecustomize
    write_tree(site_dir, {"fixture_kernel-1.2.3.dist-info/METADATA":
                          "Metadata-Version: 2.1\nName: fixture-kernel\nVersion: 1.2.3\n"})
    assert installed_versions(["fixture-kernel", "no-such-dist"], str(python)) == {"fixture-kernel": "1.2.3"}
    with pytest.raises(snapshot_mod.SnapshotError, match="no installed distribution provides 'vllm_metax'"):
        snapshot_mod._export_installed("vllm_metax", tmp_path / "export", str(python))
    assert [m for m in markers if m.exists()] == []


def test_port_fence_of_a_probe_target() -> None:
    from metax_audit.stages.probing.run import port_fence

    assert port_fence("flashinfer:BatchDecodeWithPagedKVCacheWrapper", ["vllm_metax"]) == ("vllm_metax",)
    assert port_fence("torch-reference", ["vllm_ascend"]) == ("vllm_ascend",)
    for asked in ("port-triton:merge_attn_states", "vllm_metax.v1.ops:decode", "ops/kernel.py:decode"):
        assert port_fence(asked, ["vllm_metax"]) is None


# ---------------------------------------------------------------- 4/5. exit codes and hostile config values

HOSTILE_CONFIG = [
    ("max-file-bytes: -1", "max-file-bytes must be a whole number"),
    ("max-file-bytes: true", "max-file-bytes must be a whole number"),
    ("max-file-bytes: abc", "max-file-bytes must be a whole number"),
    ("scope: ['../outside/*.py']", "scope must stay inside the repository"),
    ("scope: ['/abs/*.py']", "scope must stay inside the repository"),
    ("scope: ['**a']", "scope is not a valid glob"),
    ("scope: []", "scope must be a non-empty list"),
    ("port-package: '..'", "port-package must be a dotted Python package name"),
    ("port-package: 3", "port-package must be a dotted Python package name"),
    ("port-package: [a]", "port-package must be a dotted Python package name"),
    ("port-package: null", "port-package must be a dotted Python package name"),
    ("port-package: ''", "port-package must be a dotted Python package name"),
    ("platform-file: 3", "platform-file must be a non-empty repo-relative path"),
    ("waivers: 3", "waivers must be a non-empty repo-relative path"),
    ("waivers: /etc/passwd", "waivers must stay inside the repository"),
    ("severity-overrides: fatal", "severity-overrides must be a mapping"),
    ("severity-overrides: {some-rule: fatal}", "severity-overrides maps 'some-rule' to 'fatal'"),
    ("path-map: [a]", "path-map must be a mapping"),
    ("path-map: {a.py: ../../etc/passwd}", "path-map must stay inside the repository"),
    ("kernel-modules: flashinfer", "kernel-modules must be a list of strings"),
    ("scope: [", "not valid YAML: expected the node content"),
    ("1: 2", "unknown setting 1"),
    (b"port-package: \"\xff\"\n", "not UTF-8 text"),
]


@pytest.mark.parametrize(("text", "message"), HOSTILE_CONFIG, ids=[str(t)[:40] for t, _ in HOSTILE_CONFIG])
def test_hostile_config_values_are_one_line_exit_2(tmp_path: Path, demo_repo: Path, text: str | bytes, message: str) -> None:
    from typer.testing import CliRunner

    from metax_audit.cli import app

    cfg = demo_repo / ".metax-audit.yaml"
    cfg.write_bytes(text if isinstance(text, bytes) else text.encode() + b"\n")
    before = fingerprint(demo_repo)
    r = CliRunner().invoke(app, review_args(tmp_path / "out", "--worktree", "--repo", str(demo_repo)))
    assert r.exit_code == 2, r.output
    line = one_line_error(r.stderr)
    assert message in line and ".metax-audit.yaml" in line, line
    assert fingerprint(demo_repo) == before
    assert not (tmp_path / "out" / "summary.md").exists()  # no report from a review that could not run


def test_debug_changes_only_what_is_printed(tmp_path: Path, demo_repo: Path) -> None:
    (demo_repo / ".metax-audit.yaml").write_text("max-file-bytes: -1\n")
    plain = run_tool(demo_repo, *review_args(tmp_path / "out", "--worktree"))
    debug = run_tool(demo_repo, "--debug", *review_args(tmp_path / "out", "--worktree"))
    assert plain.returncode == debug.returncode == 2
    one_line_error(plain.stderr)
    assert "Traceback" in debug.stderr and debug.stderr.rstrip().splitlines()[-1] == plain.stderr.strip()


def test_a_config_that_narrows_the_review_is_reported(tmp_path: Path, demo_repo: Path) -> None:
    import json

    (demo_repo / ".metax-audit.yaml").write_text("scope: ['vllm_metax/platform.py']\nmax-file-bytes: 99999999\n")
    r = run_tool(demo_repo, *review_args(tmp_path / "out", "--worktree", "--fail-on", "never"))
    assert r.returncode == 0, r.stderr
    summary = (tmp_path / "out" / "summary.md").read_text()
    head = summary.split("## ")[0]
    assert "the config narrows the review: scope leaves out " in head and "file(s) the default globs select (" in head
    assert "max-file-bytes raised to 99999999" in head
    stages = {s["name"]: s["note"] for s in json.loads((tmp_path / "out" / "report.json").read_text())["stages"]}
    assert stages["config"].startswith("the config narrows the review")


@pytest.mark.parametrize("option", ["--upstream", "--base", "--python"])
def test_empty_option_values_are_rejected(tmp_path: Path, demo_repo: Path, option: str) -> None:
    r = run_tool(demo_repo, "review", option, "", "--output-dir", str(tmp_path / "out"))
    assert r.returncode == 2
    assert f"{option} is empty" in one_line_error(r.stderr)


@pytest.mark.parametrize(("text", "message"), [
    ("- {rule: x, path: a.py, reason: r, expires: 2026-13-01}\n", "month must be in 1..12"),
    ("- {rule: x, path: a.py\n", "is not valid YAML"),
    (b"\xff\xfe", "is not UTF-8 text"),
])
def test_hostile_waivers_are_one_line_exit_2(tmp_path: Path, demo_repo: Path, text: str | bytes, message: str) -> None:
    waivers = tmp_path / "w.yaml"
    waivers.write_bytes(text if isinstance(text, bytes) else text.encode())
    r = run_tool(demo_repo, *review_args(tmp_path / "out", "--worktree", "--waivers", str(waivers)))
    assert r.returncode == 2
    assert message in one_line_error(r.stderr)


# ---------------------------------------------------------------- 3. deep but valid expressions

DEEP = {
    "one-line": "        _deep = " + " + ".join(["'a'"] * 2000) + "\n",
    "multi-line": "        _deep = (\n" + " +\n".join(["            'a'"] * 1500) + ")\n",
    "unary": "        _deep = " + "-" * 400 + "1\n",
    "calls": "        _deep = " + "f(" * 180 + ")" * 180 + "\n",
}


@pytest.mark.parametrize("shape", sorted(DEEP))
def test_deep_expression_in_a_compared_method_is_not_a_crash(tmp_path: Path, demo_repo: Path, shape: str) -> None:
    import json

    path = demo_repo / "vllm_metax" / "v1" / "attention" / "backends" / "flashinfer.py"
    text = path.read_text()
    anchor = "    def get_name() -> str:\n"
    assert anchor in text
    path.write_text(text.replace(anchor, anchor + DEEP[shape], 1))
    before = fingerprint(demo_repo)
    r = run_tool(demo_repo, *review_args(tmp_path / "out", "--worktree", "--no-cache"))
    assert r.returncode == 1, r.stderr  # the demo's findings, not "could not audit"
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
    assert fingerprint(demo_repo) == before
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    # compared, not skipped: the method that holds the expression differs from upstream's
    assert any(d["symbol"].endswith("get_name") for f in report["files"] for d in f["differences"]), report["files"]


@pytest.mark.parametrize("where", ["default-arg", "class-attr", "decorator"])
def test_deep_expression_outside_a_body_is_not_a_crash(tmp_path: Path, demo_repo: Path, where: str) -> None:
    deep = " + ".join(["'a'"] * 1500)
    head = "    @staticmethod\n    def get_name() -> str:\n"
    new = {"default-arg": f"    @staticmethod\n    def get_name(x={deep}) -> str:\n",
           "class-attr": f"    DEEP = {deep}\n\n{head}",
           "decorator": f"    @staticmethod\n    @deco({deep})\n    def get_name() -> str:\n"}[where]
    path = demo_repo / "vllm_metax" / "v1" / "attention" / "backends" / "flashinfer.py"
    path.write_text(path.read_text().replace(head, new, 1))
    before = fingerprint(demo_repo)
    r = run_tool(demo_repo, *review_args(tmp_path / "out", "--worktree", "--no-cache"))
    assert r.returncode == 1, r.stderr
    assert "internal error" not in r.stderr and fingerprint(demo_repo) == before


# A deep expression where each stage meets it: a kernel call's argument and keyword (trace, the call
# checks), the value an LSE flows through (dataflow), a wrapped call, a class attribute (capability
# checks); findings and the reports carry what the stages make of it.
KERNEL_CALL = "                new_out, new_lse = attn_metadata.prefill_new_wrapper.run(prefill_query, kv_cache, return_lse=True)\n"
DEEP_EXPR = {"binop": " + ".join(["a"] * 1500), "unary": "-" * 1500 + "1", "attrs": "a" + ".b" * 1500,
             "ifexp": " if c else ".join(["a"] * 1500), "calls": "f(" * 190 + ")" * 190}
STAGE_PLACES = {
    "kernel-arg": lambda e: KERNEL_CALL.replace("(prefill_query, ", f"({e}, "),
    "kernel-kwarg": lambda e: KERNEL_CALL.replace("return_lse=True)", f"return_lse=True, scale={e})"),
    "lse-value": lambda e: KERNEL_CALL + f"                new_lse = ({e}) + new_lse\n",
    "wrapped-call": lambda e: KERNEL_CALL.replace("= attn_metadata", "= (attn_metadata").replace("=True)\n", f"=True)) + {e}\n"),
}


@pytest.mark.parametrize("kind", sorted(DEEP_EXPR))
@pytest.mark.parametrize("place", sorted(STAGE_PLACES))
def test_deep_expression_where_each_stage_meets_it_is_coverage(tmp_path: Path, demo_repo: Path, place: str, kind: str) -> None:
    import json

    path = demo_repo / "vllm_metax" / "v1" / "attention" / "backends" / "flashinfer.py"
    text = path.read_text()
    assert KERNEL_CALL in text
    path.write_text(text.replace(KERNEL_CALL, STAGE_PLACES[place](DEEP_EXPR[kind]), 1))
    line = text[: text.index(KERNEL_CALL)].count("\n") + 1 + (place == "lse-value")
    before = fingerprint(demo_repo)
    r = run_tool(demo_repo, *review_args(tmp_path / "out", "--worktree", "--no-cache", "--format", "json,md,sarif,junit"))
    assert r.returncode == 1, r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr and fingerprint(demo_repo) == before
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    rel = "vllm_metax/v1/attention/backends/flashinfer.py"
    deep = [f for f in report["findings"] if f["rule"] == "MXA002" and f"expression too deep to analyse at {rel}:{line}" in f["message"]]
    assert deep, [f["message"] for f in report["findings"] if f["rule"].startswith("MXA00")]
    assert {s["name"] for s in report["stages"] if s["ran"]} >= {"trace", "compare", "checks", "dataflow"}


def test_prune_deep_cuts_each_too_deep_expression_once_and_only_those() -> None:
    import ast
    import copy

    from metax_audit.core.pysource import EXPR_DEPTH_LIMIT, TOO_DEEP_NAME, parse, prune_deep, too_deep_lines

    for kind, expr in DEEP_EXPR.items():
        tree = parse(f"def g(x={expr}):\n    return {expr}\n\nY = f'{{{expr}}}'\n")
        assert too_deep_lines(tree) == (1, 2, 4), kind
        # every recursive walk of the stages now stays within its bounds
        assert TOO_DEEP_NAME in ast.unparse(tree) and copy.deepcopy(tree) and ast.dump(tree)
        ast.NodeVisitor().visit(tree)
        compile(tree, "<deep>", "exec")
    shallow = "x = " + " + ".join(["a"] * EXPR_DEPTH_LIMIT)
    assert too_deep_lines(parse(shallow)) == ()
    # the shortcut over short nodes cuts exactly what a full walk cuts (real sources, a low limit)
    for path in sorted((PROJECT / "metax_audit").rglob("*.py"))[:60]:
        text = path.read_text()
        fast, full = ast.parse(text), ast.parse(text)
        assert prune_deep(fast, text, limit=6) == prune_deep(full, None, limit=6)
        assert ast.dump(fast) == ast.dump(full)


def test_compare_dump_is_ast_dump_without_recursion() -> None:
    import ast

    from metax_audit.core.pysource import dump, dump_iterative

    for path in sorted((PROJECT / "metax_audit").rglob("*.py"))[:40]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.stmt | ast.expr | ast.arguments):
                assert dump_iterative(node) == ast.dump(node)
    deep = ast.parse("x = " + " + ".join(["'a'"] * 2000)).body[0]
    text = dump(deep)  # ast.dump itself raises RecursionError here
    assert text.startswith("Assign(targets=[Name(id='x', ctx=Store())], value=BinOp(") and text.count("BinOp(") == 1999


# ---------------------------------------------------------------- 6. output

EVIL = "evil\x1b[31mred\x07bell é.py"


def test_control_characters_in_file_names_are_escaped_everywhere(tmp_path: Path, demo_repo: Path) -> None:
    import json
    import xml.etree.ElementTree as ET

    backends = demo_repo / "vllm_metax" / "v1" / "attention" / "backends"
    (backends / EVIL).write_text("import missing_kernel_module\n\nX = missing_kernel_module.run(1)\n")
    before = fingerprint(demo_repo)
    out = tmp_path / "out"
    r = run_tool(demo_repo, "review", "--upstream", str(demo.upstream_root()), "--output-dir", str(out), "--worktree",
                 "--fail-on", "never")
    assert r.returncode == 0, r.stderr
    assert fingerprint(demo_repo) == before
    rel = f"vllm_metax/v1/attention/backends/{EVIL}"
    data = json.loads((out / "report.json").read_text())
    assert rel in [f["path"] for f in data["files"]]  # JSON keeps the true name (escaped by JSON itself)
    for name in ("summary.md", "report.sarif", "report.junit.xml"):
        text = (out / name).read_text()
        assert "\x1b" not in text and "\x07" not in text, name
    ET.fromstring((out / "report.junit.xml").read_text())  # well-formed
    assert "evil\\x1b[31mred\\x07bell é.py" in (out / "report.junit.xml").read_text()
    sarif = json.loads((out / "report.sarif").read_text())
    uris = {loc["physicalLocation"]["artifactLocation"]["uri"] for res in sarif["runs"][0]["results"]
            for loc in res.get("locations", [])}
    assert "vllm_metax/v1/attention/backends/evil%1B%5B31mred%07bell%20%C3%A9.py" in uris
    assert "evil\\x1b[31mred\\x07bell é.py" in (out / "summary.md").read_text()
    assert not [p for p in (out / "files").iterdir() if "\x1b" in p.name or "\x07" in p.name]
    assert "\x1b" not in r.stdout + r.stderr and "\x07" not in r.stdout + r.stderr


def test_symlinks_in_the_output_dir_are_replaced_never_followed(tmp_path: Path, demo_repo: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.md").write_text("keep\n")
    os.symlink("../victim.txt", out / "summary.md")
    os.symlink(str(victim), out / "report.json")
    os.symlink(str(elsewhere), out / "files")
    r = run_tool(demo_repo, *review_args(out, "--worktree", "--fail-on", "never"))
    assert r.returncode == 0, r.stderr
    assert victim.read_text() == "precious\n"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep.md"]
    for name in ("summary.md", "report.json", "files"):
        assert not (out / name).is_symlink(), name
    assert (out / "summary.md").read_text().startswith("#")
    assert not [p for p in out.iterdir() if p.name.startswith("metax-audit-")]  # no staging left


def test_a_killed_runs_leftovers_are_reclaimed(tmp_path: Path, demo_repo: Path) -> None:
    import signal
    import time

    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    out = tmp_path / "out"
    env = {"TMPDIR": str(private_tmp)}
    full = {**os.environ, "PYTHONPATH": str(PROJECT), "CI": "1", **env}
    proc = subprocess.Popen([sys.executable, "-m", "metax_audit", "review", "--staged", "--repo", str(demo_repo),
                             "--test", "sleep 30", "--output-dir", str(out)], env=full,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and not list(private_tmp.glob(f"metax-audit-snap-{proc.pid}-*")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    left = list(private_tmp.glob(f"metax-audit-snap-{proc.pid}-*"))
    assert left, "the killed run left no snapshot to reclaim (the test did not test anything)"
    # a live process's directory and one that is not ours by name are never touched
    live = private_tmp / f"metax-audit-snap-{os.getpid()}-abcdefgh"
    live.mkdir()
    other = private_tmp / "someone-else"
    other.mkdir()
    stale_stage = out / f"metax-audit-report-{proc.pid}-zzzzzzzz"
    stale_stage.mkdir(parents=True)
    before = fingerprint(demo_repo)
    r = run_tool(demo_repo, *review_args(out, "--worktree", "--fail-on", "never"), env=env)
    assert r.returncode == 0, r.stderr
    assert not any(p.exists() for p in left) and not stale_stage.exists()
    assert live.is_dir() and other.is_dir()
    assert fingerprint(demo_repo) == before
