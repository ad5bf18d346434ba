# Golden files of every renderer on the bundled demo port (the whole review pipeline), with the
# run-specific parts (commit, temp dirs, timings, install path) normalised so any machine agrees.
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from metax_audit.core.models import AuditReport
from metax_audit.report import write_reports

GOLDEN = Path(__file__).parent / "golden" / "demo"
UPDATE = "METAX_AUDIT_UPDATE_GOLDEN"
REGENERATE = f"{UPDATE}=1 python -m pytest tests/test_report_demo.py"


def normalise(report: AuditReport) -> AuditReport:
    """Fix what differs between two runs on two machines: commit sha, repo path, clocks, host."""
    env = {k: "<varies>" if k.endswith(("_at", "host")) else v for k, v in report.environment.items()}
    return replace(
        report,
        environment=env,
        snapshot=replace(report.snapshot, repo="/demo/repo", commit="0" * 40),
        baseline_info={**report.baseline_info, "commit": "0" * 40} if report.baseline_info else {},
        generated_at="2026-01-01T00:00:00+00:00",
        wall_seconds=0.0,
        stages=tuple(replace(s, seconds=0.0) for s in report.stages),
    )


def _review(repo: Path) -> AuditReport:
    from metax_audit import demo as demo_mod
    from metax_audit.pipeline.review import ReviewOptions, review

    demo_mod.build_demo_repo(repo)
    options = ReviewOptions(mode="staged", repo=repo, upstream=str(demo_mod.upstream_root()), extra_path=(demo_mod.stack_root(),))
    return review(options).report


def _texts(root: Path, replacements: dict[str, str]) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            for old, new in replacements.items():
                text = text.replace(old, new)
            out[path.relative_to(root).as_posix()] = text
    return out


def test_demo_golden_files(tmp_path):
    from metax_audit import demo as demo_mod

    report = normalise(_review(tmp_path / "repo"))
    write_reports(report, tmp_path / "reports", ["md", "json", "sarif", "junit"])
    data = str(demo_mod.data_root())
    # Paths of this checkout appear in upstream sources and introspection evidence; Markdown
    # escapes underscores, so the escaped spelling is replaced too.
    got = _texts(tmp_path / "reports", {data: "<demo-data>", data.replace("_", "\\_"): "<demo-data>", str(tmp_path): "<tmp>"})
    if os.environ.get(UPDATE):
        for name, text in got.items():
            (GOLDEN / name).parent.mkdir(parents=True, exist_ok=True)
            (GOLDEN / name).write_text(text, encoding="utf-8")
    assert GOLDEN.is_dir(), f"no demo golden files yet: run `{REGENERATE}`"
    want = _texts(GOLDEN, {})
    hint = f"demo golden files differ; if the change is intended, run `{REGENERATE}` and review the diff"
    assert sorted(got) == sorted(want), hint
    for name in want:
        assert got[name] == want[name], f"{name}: {hint}"


def test_every_rule_of_a_review_is_declared_in_a_fresh_interpreter(tmp_path):
    """A stage that runs in a forked child (dataflow) makes findings whose rules the parent must
    know too, or SARIF and Markdown lose their help text; other tests importing the check modules
    would hide that here, so the review runs in an interpreter of its own."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from metax_audit import demo\n"
        "from metax_audit.core.findings import RULES\n"
        "from metax_audit.pipeline.review import ReviewOptions, review\n"
        "repo = demo.build_demo_repo(Path(sys.argv[1]))\n"
        "report = review(ReviewOptions(mode='staged', repo=repo, upstream=str(demo.upstream_root()),\n"
        "                              extra_path=(demo.stack_root(),))).report\n"
        "used = {f.rule for f in report.findings}\n"
        "print(sorted(used - set(RULES)), len(used))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "repo")], capture_output=True, text=True,
                          env=env, timeout=300, check=True)
    missing, used = done.stdout.split("] ")
    assert missing == "[" and int(used) > 5, done.stdout
