# Without --base the base release comes from the port's own history: what the port declared (an upstream
# pin, or its own version when it is the release under review) before the commit that set the current one.
from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from conftest import git, write_tree

from metax_audit.stages.upstream.base_infer import infer_base

SETUP = 'def fixed_version_scheme(version):\n    return "{v}"\n\nsetup(name="vllm-vendor")\n'


def _repo(tmp_path: Path, history: list[tuple[str, dict[str, str]]]) -> Path:
    repo = tmp_path / "port"
    repo.mkdir(parents=True)
    git(repo, "init", "-q")
    for subject, files in history:
        write_tree(repo, files)
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", subject)
    return repo


def test_the_base_is_the_version_declared_before_the_last_sync_commit(tmp_path: Path) -> None:
    repo = _repo(tmp_path, [("align to 0.24", {"setup.py": SETUP.format(v="0.24.0")}),
                            ("align to 0.25", {"setup.py": SETUP.format(v="0.25.0"), "a.py": "x = 1\n"}),
                            ("sync attention to 0.26", {"setup.py": SETUP.format(v="0.26.0")}),
                            ("fix a bug", {"a.py": "x = 2\n"})])
    guess = infer_base(repo, "HEAD", "0.26.0", "vllm", "vllm_vendor", "master")
    assert guess.version == "0.25.0"
    sha = git(repo, "rev-parse", "--short=7", "HEAD~1").strip()
    assert guess.evidence == (f"inferred from the port's history: at master setup.py declares the port's version 0.26.0; "
                              f"it declared 0.25.0 before {sha} (sync attention to 0.26) changed it to 0.26.0")
    # At an older revision the same history gives that revision's base.
    assert infer_base(repo, "HEAD~2", "0.25.0", "vllm", "vllm_vendor").version == "0.24.0"


def test_an_upstream_pin_older_than_the_release_under_review_is_the_base(tmp_path: Path) -> None:
    repo = _repo(tmp_path, [("pin", {"requirements/common.txt": "torch==2.10\nvllm==0.25.0  # the release we follow\n"})])
    guess = infer_base(repo, "HEAD", "0.26.0", "vllm", "vllm_vendor")
    assert guess.version == "0.25.0"
    assert "requirements/common.txt pins vllm==0.25.0, older than 0.26.0" in guess.evidence


def test_without_a_declaration_the_base_is_not_inferred_and_says_why(tmp_path: Path) -> None:
    repo = _repo(tmp_path, [("init", {"a.py": "x = 1\n"})])
    guess = infer_base(repo, "HEAD", "0.26.0", "vllm", "vllm_vendor")
    assert guess.version is None and guess.evidence.startswith("not inferred: the port at HEAD pins no vllm release")
    # The port's own version that is not the release under review says nothing about vLLM's.
    repo2 = _repo(tmp_path / "own", [("v1", {"setup.py": SETUP.format(v="1.2.0")})])
    guess = infer_base(repo2, "HEAD", "0.26.0", "vllm", "vllm_vendor")
    assert guess.version is None and "setup.py declares the port's version 1.2.0, not the vllm 0.26.0 under review" in guess.evidence
    # Not a repository at all: no guess, no exception.
    assert infer_base(tmp_path / "nowhere", "HEAD", "0.26.0", "vllm", "vllm_vendor").version is None


def test_a_review_without_base_uses_the_inferred_release_and_says_where_it_came_from(tmp_path: Path, audit_cache: Path) -> None:
    from metax_audit import demo as demo_mod
    from metax_audit.pipeline.review import ReviewOptions, review

    repo = demo_mod.build_demo_repo(tmp_path / "port")
    for v, subject in (("0.25.0", "align to 0.25"), ("0.26.0", "sync to 0.26")):
        write_tree(repo, {"setup.py": SETUP.format(v=v)})
        git(repo, "add", "setup.py")
        git(repo, "commit", "-qm", subject)
    # The base release's sources, as a first download would have cached them (tests never download).
    entry = audit_cache / "upstream" / "vllm-0.25.0"
    shutil.copytree(demo_mod.upstream_root(), entry)
    for name in ("__init__.py", "version.py"):
        (entry / "vllm" / name).write_text('__version__ = "0.25.0"\n', encoding="utf-8")
    (entry / ".metax-audit-complete").write_text("vllm==0.25.0\n", encoding="utf-8")
    options = ReviewOptions(mode="rev", rev="HEAD", repo=repo, upstream=str(demo_mod.upstream_root()),
                            extra_path=(demo_mod.stack_root(),), no_cache=True)
    report = review(options).report
    assert report is not None and report.base is not None and report.base.version == "0.25.0"
    assert report.base.source.startswith("inferred from the port's history: at HEAD setup.py declares the port's version 0.26.0")
    assert "it declared 0.25.0 before" in report.base.source and "(sync to 0.26) changed it to 0.26.0" in report.base.source
    # --base still wins.
    explicit = review(replace(options, base=str(entry))).report
    assert explicit is not None and explicit.base is not None and not explicit.base.source.startswith("inferred")
