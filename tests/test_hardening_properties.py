# Property-based hardening (issue 31): for any file name, config value or YAML nesting, the tool never
# tracebacks, its exit code is 0, 1 or 2, and its reports stay well-formed (JSON and SARIF parse,
# JUnit is XML, Markdown renders no HTML from a name, every page link names a page). Examples are few
# and the fixtures demo-sized so the suite stays quick.
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path
from urllib.parse import unquote

import pytest
import report_factory as rf
from conftest import git
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from metax_audit import demo
from metax_audit.core.config import load_config
from metax_audit.core.errors import ConfigError
from metax_audit.report import write_reports

PROJECT = Path(__file__).resolve().parents[1]
FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])

# A legal file name: anything but "/" and NUL, not "." or "..", at most 250 bytes (NAME_MAX 255 with ".py").
# Surrogates cannot be encoded on a POSIX filesystem; the rest of Unicode can.
NAME_CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00")
names = st.text(NAME_CHARS, min_size=1, max_size=60).map(lambda s: s + ".py").filter(
    lambda s: len(s.encode()) <= 250 and s not in (".py",))
tricky = st.sampled_from(["`", "``", "\r", "<", ">", "&", "|", "[", "]", "(", ")", "*", "_", "\\", "\n", "\x1b", "\u202e",
                          "<img src=x onerror=alert(1)>", "<script>", "](javascript:x)", "&lt;", " ", "#", "!"])
hostile_names = st.lists(st.one_of(tricky, st.text(NAME_CHARS, max_size=8)), min_size=1, max_size=8).map(
    lambda parts: "".join(parts).replace("/", "_") + ".py").filter(lambda s: len(s.encode()) <= 250)


def _no_raw_html(markdown_text: str) -> None:
    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark").enable("table").render(markdown_text)
    allowed = {"p", "ul", "ol", "li", "code", "strong", "em", "a", "h1", "h2", "h3", "h4", "table", "thead", "tbody",
               "tr", "th", "td", "pre", "blockquote", "sub", "hr", "br", "details", "summary"}
    tags = {m.group(1).lower() for m in re.finditer(r"<\s*/?\s*([A-Za-z][A-Za-z0-9-]*)", html)}
    assert tags <= allowed, tags - allowed
    for href in re.findall(r'href="([^"]*)"', html):
        assert not href.lower().startswith(("javascript:", "data:", "vbscript:")), href


def renamed_report(name: str):  # type: ignore[no-untyped-def]
    """The factory report with its first file (and that file's findings) renamed to a file called `name`."""
    report = rf.make_report()
    old = report.files[0].path
    new = f"{old.rsplit('/', 1)[0]}/{name}" if "/" in old else name
    files = (replace(report.files[0], path=new), *report.files[1:])
    findings = tuple(replace(f, location=replace(f.location, path=new)) if f.location.path == old else f
                     for f in report.findings)
    return replace(report, files=files, findings=findings), new


def check_reports(out: Path, path: str | None = None) -> None:
    data = json.loads((out / "report.json").read_text(encoding="utf-8"))
    if path is not None:
        assert path in {f["path"] for f in data["files"]}
    json.loads((out / "report.sarif").read_text(encoding="utf-8"))
    ET.fromstring((out / "report.junit.xml").read_text(encoding="utf-8"))
    summary = (out / "summary.md").read_text(encoding="utf-8")
    _no_raw_html(summary)
    pages = list((out / "files").iterdir())
    assert all(len(p.name.encode()) <= 160 for p in pages)
    for page in pages:
        _no_raw_html(page.read_text(encoding="utf-8"))
    links = {unquote(m) for m in re.findall(r"\]\((files/[^)\s]+)\)", summary)}
    assert all((out / link).is_file() for link in links), links


@FAST
@given(name=st.one_of(names, hostile_names))
def test_any_file_name_renders_well_formed_reports(tmp_path_factory: pytest.TempPathFactory, name: str) -> None:
    report, path = renamed_report(name)
    out = tmp_path_factory.mktemp("out")
    write_reports(report, out, ["md", "json", "sarif", "junit"])
    check_reports(out, path)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(name=st.one_of(names, hostile_names))
@example(name="\r.py")  # subprocess text mode read it back as "\n.py"
@example(name="a\r\nb.py")
def test_any_file_name_survives_every_snapshot_mode(tmp_path_factory: pytest.TempPathFactory, name: str) -> None:
    from metax_audit.stages.snapshot import snapshot

    assume(name not in (".git.py",) and not name.startswith(".git"))
    repo = tmp_path_factory.mktemp("repo")
    (repo / "pkg").mkdir()
    (repo / "pkg" / name).write_bytes(b"X = 1\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "one")
    for mode, rev in (("staged", None), ("worktree", None), ("rev", "HEAD")):
        with snapshot(mode, repo, rev) as snap:  # type: ignore[arg-type]
            assert (snap.root / "pkg" / name).read_bytes() == b"X = 1\n", mode


def run_review(repo: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(PROJECT), "CI": "1"}
    env.pop("PYTHONSAFEPATH", None)
    return subprocess.run([sys.executable, "-m", "metax_audit", "review", "--upstream", str(demo.upstream_root()),
                           "--output-dir", str(out), "--format", "md,json,sarif,junit", *extra],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=300)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(name=hostile_names)
def test_a_review_of_any_file_name_is_exit_0_1_or_2_without_traceback(tmp_path_factory: pytest.TempPathFactory,
                                                                      name: str) -> None:
    base = tmp_path_factory.mktemp("review")
    repo = demo.build_demo_repo(base / "port")
    rel = f"vllm_metax/v1/attention/backends/{name}"
    (repo / rel).write_text("import torch\n\n\ndef forward(x):\n    return torch.relu(x)\n")
    git(repo, "add", "--", rel)
    r = run_review(repo, base / "out", "--fail-on", "warning")
    assert r.returncode in (0, 1, 2) and "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    if r.returncode != 2:
        check_reports(base / "out")


# ---------------------------------------------------------------- config values and YAML nesting

KEYS = ["port-package", "upstream-package", "scope", "class-prefixes", "path-map", "class-map", "upstream-subfolders",
        "selectors", "kernel-packages", "kernel-modules", "op-namespaces", "kernel-sources", "modification-markers",
        "waivers", "severity-overrides", "platform-file", "bogus-key"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=True),
                    st.text(max_size=20), st.sampled_from(["..", "/etc", "~", "**", "[", "{port}", "a/../b", "*.py", ""]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=12)


def _load(root: Path) -> None:
    try:
        load_config(root)
    except ConfigError as exc:
        assert "\n" not in str(exc).strip(), str(exc)  # one line


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=st.dictionaries(st.sampled_from(KEYS), values, max_size=4))
def test_any_config_value_is_a_config_or_a_config_error(tmp_path_factory: pytest.TempPathFactory, config: dict) -> None:
    import yaml

    root = tmp_path_factory.mktemp("cfg")
    (root / ".metax-audit.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    _load(root)
    toml_root = tmp_path_factory.mktemp("toml")
    (toml_root / "pyproject.toml").write_text("[tool.metax-audit]\n" + "".join(
        f"{k} = {json.dumps(v)}\n" for k, v in config.items() if isinstance(v, str | int | bool | list)
        and json.dumps(v).isascii()), encoding="utf-8")
    _load(toml_root)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(depth=st.integers(min_value=1, max_value=6000), flow=st.booleans(), key=st.sampled_from(KEYS))
def test_any_yaml_nesting_is_a_config_or_a_config_error(tmp_path_factory: pytest.TempPathFactory, depth: int,
                                                        flow: bool, key: str) -> None:
    root = tmp_path_factory.mktemp("deep")
    if flow:
        text = f"{key}: " + "[" * depth + "x" + "]" * depth + "\n"
    else:
        text = f"{key}:\n" + "".join(" " * (i + 1) + "- \n" if i < depth - 1 else " " * (i + 1) + "- x\n"
                                     for i in range(min(depth, 3000)))
    (root / ".metax-audit.yaml").write_text(text, encoding="utf-8")
    _load(root)
