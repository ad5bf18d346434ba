# The result cache: an identical review is served whole (same findings, a result-cache stage, no
# temp path of the earlier snapshot); a changed file, another upstream or --no-cache recompute.
from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from metax_audit.cache.memo import review_memo
from metax_audit.core.models import AuditReport


def _review(repo: Path, **kw: object) -> AuditReport:
    from metax_audit import demo as demo_mod
    from metax_audit.pipeline.review import ReviewOptions, review

    options = ReviewOptions(mode="rev", rev="HEAD", repo=repo, upstream=str(demo_mod.upstream_root()),
                            extra_path=(demo_mod.stack_root(),))
    return review(replace(options, **kw)).report  # type: ignore[arg-type]


def _served(report: AuditReport) -> bool:
    return any(s.name == "result-cache" for s in report.stages)


@pytest.fixture
def demo_repo(tmp_path: Path) -> Path:
    from metax_audit import demo as demo_mod

    return demo_mod.build_demo_repo(tmp_path / "port")


def test_identical_review_is_served_from_the_cache(demo_repo: Path, audit_cache: Path) -> None:
    first = _review(demo_repo)
    assert not _served(first)
    again = _review(demo_repo)
    assert _served(again)
    assert [(f.id, f.content, f.location) for f in again.findings] == [(f.id, f.content, f.location) for f in first.findings]
    assert again.snapshot.root != first.snapshot.root
    assert str(first.snapshot.root) not in repr(again)  # the earlier temp export never leaks
    assert list((audit_cache / "results" / "review").glob("*.entry"))
    fresh = _review(demo_repo, no_cache=True)
    assert not _served(fresh) and [f.id for f in fresh.findings] == [f.id for f in first.findings]


def test_a_changed_file_or_upstream_is_recomputed(demo_repo: Path, tmp_path: Path, audit_cache: Path) -> None:
    from metax_audit import demo as demo_mod

    first = _review(demo_repo)
    fi = demo_repo / "vllm_metax/v1/attention/backends/flashinfer.py"
    fi.write_text(fi.read_text(encoding="utf-8").replace("fixed_split_size=None,", "fixed_split_sizes=None,"), encoding="utf-8")
    subprocess.run(["git", "commit", "-qam", "rename a keyword"], cwd=demo_repo, check=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@e", "PATH": "/usr/bin:/bin"})
    changed = _review(demo_repo)
    assert not _served(changed)
    assert {f.id for f in changed.findings} != {f.id for f in first.findings}
    up = tmp_path / "upstream"
    subprocess.run(["cp", "-a", str(demo_mod.upstream_root()), str(up)], check=True)
    assert not _served(_review(demo_repo, upstream=str(up)))


def test_per_file_compare_cache_equals_compare_and_recomputes_only_the_changed_file(demo_repo: Path,
                                                                                   audit_cache: Path) -> None:
    from metax_audit import demo as demo_mod
    from metax_audit.core.config import load_config
    from metax_audit.stages import discover, snapshot
    from metax_audit.stages.compare import compare
    from metax_audit.stages.compare.per_file import cached_compare
    from metax_audit.stages.upstream import resolve_upstream

    up = resolve_upstream(str(demo_mod.upstream_root()))

    def both(mode: str) -> tuple[object, object, int, object, object]:
        with snapshot.snapshot(mode, demo_repo, "HEAD" if mode == "rev" else None, package="vllm_metax") as snap:
            config = load_config(snap.root)
            found = discover.discover(snap.root, config)
            plain = compare(found, config, up)
            comparison, findings, recomputed = cached_compare(found, config, up, memo=review_memo(True))
            return comparison, [(f.id, f.content) for f in findings], recomputed.files, plain[0], [(f.id, f.content) for f in plain[1]]

    c, f, n, pc, pf = both("rev")
    assert (c, f) == (pc, pf) and n > 1
    c, f, n, pc, pf = both("rev")
    assert (c, f) == (pc, pf) and n == 0  # all served
    c, f, n, pc, pf = both("staged")  # the index differs from HEAD in flashinfer.py only
    assert (c, f) == (pc, pf) and n == 1


def test_a_files_compare_key_follows_the_files_naming_its_functions(tmp_path: Path, audit_cache: Path) -> None:
    """compare_dependencies: a file's digest changes when another port file starts or stops naming a
    function it defines, and only then; computed once per name (linear in files)."""
    from metax_audit.core.config import AuditConfig
    from metax_audit.stages.compare import compare_dependencies

    pkg = tmp_path / "vllm_metax"
    pkg.mkdir()
    (pkg / "platform.py").write_text("X = 1\n")
    for i in range(3):
        # one class name in all three: who names a file's classes is read too (a class only the port builds)
        (pkg / f"b{i}.py").write_text(f"class B:\n    def forward(self):\n        return {i}\n")
    (pkg / "helper.py").write_text("def only_here():\n    return 1\n")
    paths = [f"vllm_metax/b{i}.py" for i in range(3)] + ["vllm_metax/helper.py"]
    first = compare_dependencies(tmp_path, AuditConfig(), paths)
    assert len(set(first.values())) == 2  # the three backends read the same: who names `forward`
    (pkg / "user.py").write_text("from vllm_metax.helper import only_here\nonly_here()\n")
    second = compare_dependencies(tmp_path, AuditConfig(), paths)
    assert second["vllm_metax/helper.py"] != first["vllm_metax/helper.py"]
    assert all(second[p] == first[p] for p in paths[:3])
    (pkg / "user.py").write_text("def forward():\n    pass\n")
    third = compare_dependencies(tmp_path, AuditConfig(), paths)
    assert all(third[p] != second[p] for p in paths[:3]) and third["vllm_metax/helper.py"] == first["vllm_metax/helper.py"]
    # cached_compare keeps what it reads of each file (the functions it defines, the port modules it imports,
    # the imports its key reads) under its bytes: the same digests, a new function or import seen at once
    from metax_audit.stages.compare import per_file

    def kept() -> dict[str, str]:
        return compare_dependencies(tmp_path, AuditConfig(), paths,
                                    lambda path: per_file._file_facts(tmp_path, AuditConfig(), {}, path, review_memo(True))[:2])

    assert kept() == third
    assert kept() == third  # now from the cache
    (pkg / "helper.py").write_text("def only_here():\n    return 1\n\ndef forward():\n    return 2\n")
    fourth = kept()
    assert fourth["vllm_metax/helper.py"] != third["vllm_metax/helper.py"]
    assert fourth == compare_dependencies(tmp_path, AuditConfig(), paths)
    (pkg / "consts.py").write_text("def answer():\n    return True\n")
    (pkg / "helper.py").write_text("from vllm_metax.consts import answer\n\ndef only_here():\n    return 1\n\ndef forward():\n    return 2\n")
    fifth = kept()
    assert fifth["vllm_metax/helper.py"] != fourth["vllm_metax/helper.py"] and fifth == compare_dependencies(tmp_path, AuditConfig(), paths)
    (pkg / "consts.py").write_text("def answer():\n    return False\n")  # the imported module's bytes are read too
    assert kept()["vllm_metax/helper.py"] != fifth["vllm_metax/helper.py"]
