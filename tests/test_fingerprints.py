# Finding ids are fingerprints without line numbers: unrelated edits above a finding keep its id,
# a change to what the finding is about changes it; ids are unique and set once per finding.
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import metax_audit.stages.checks.signatures
import metax_audit.stages.compare  # noqa: F401 - declares MXA201
from metax_audit.core.findings import make_finding
from metax_audit.core.fingerprints import disambiguate, normalize
from metax_audit.core.models import Location

FI = "vllm_metax/v1/attention/backends/flashinfer.py"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("claim 'x' enforced at line 1346: return False", "claim 'x' enforced at line N: return False"),
        ("LSE from run (a/b/flashinfer.py:304) reaches merge", "LSE from run (a/b/flashinfer.py) reaches merge"),
        ("15 call(s) of f not checked", "N call(s) of f not checked"),
        ("kernel(q, 128)  passes  2 heads", "kernel(q, 128) passes 2 heads"),  # values are content, kept
    ],
)
def test_normalize_drops_line_numbers_and_group_counts(text: str, want: str) -> None:
    assert normalize(text) == want


def test_id_ignores_the_line_and_follows_what_the_finding_is_about() -> None:
    a = make_finding("MXA101", Location(FI, 10, "Impl.forward:run:backend"), "run(..., backend=...) not accepted (line 10)")
    moved = make_finding("MXA101", Location(FI, 42, "Impl.forward:run:backend"), "run(..., backend=...) not accepted (line 42)")
    other_kw = make_finding("MXA101", Location(FI, 10, "Impl.forward:run:out"), "run(..., out=...) not accepted (line 10)")
    other_msg = make_finding("MXA101", Location(FI, 10, "Impl.forward:run:backend"), "run(..., backends=...) not accepted")
    assert a.id == moved.id and a.id.startswith("MXA101-")
    assert len({a.id, other_kw.id, other_msg.id}) == 3


def test_explicit_key_keeps_the_id_while_the_content_changes() -> None:
    base = make_finding("MXA201", Location(FI, 5, "f"), "flow: base 2 vs e", key="producer -> consumer(lse=)")
    more = make_finding("MXA201", Location(FI, 5, "f"), "flow: base 2 vs e; layout [H,T] vs [T,H]", key="producer -> consumer(lse=)")
    assert base.id == more.id and base.content != more.content
    # the content hash ignores line references too
    a = make_finding("MXA201", Location(FI, 5, "f"), "m", ["a.py:10: x = 1"])
    b = make_finding("MXA201", Location(FI, 9, "f"), "m", ["a.py:14: x = 1"])
    assert a.content == b.content


def test_same_fingerprint_twice_gets_an_occurrence_suffix_in_file_order() -> None:
    first = make_finding("MXA201", Location(FI, 30, "f"), "unresolved call g")
    second = make_finding("MXA201", Location(FI, 12, "f"), "unresolved call g")
    out = disambiguate([first, second])
    assert out[1].id == first.id and out[0].id == f"{first.id}-2"  # the earlier line keeps the plain id


def test_id_is_a_field_set_once() -> None:
    from dataclasses import fields, replace

    f = make_finding("MXA201", Location(FI, 1, "f"), "m")
    assert "id" in {x.name for x in fields(f)}
    assert replace(f, message="other words", waived=True).id == f.id  # identity survives replace


# ---------------------------------------------------------------- whole review on the demo port


def _review_ids(repo: Path) -> dict[str, tuple[str, int, str]]:
    from metax_audit import demo as demo_mod
    from metax_audit.pipeline.review import ReviewOptions, review

    options = ReviewOptions(mode="worktree", repo=repo, upstream=str(demo_mod.upstream_root()),
                            extra_path=(demo_mod.stack_root(),))
    report = review(options).report
    ids = [f.id for f in report.findings]
    assert len(ids) == len(set(ids)), "finding ids must be unique"
    return {f.id: (f.location.path, f.location.line, f.content) for f in report.findings}


@pytest.fixture(scope="module")
def demo_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from metax_audit import demo as demo_mod

    repo = demo_mod.build_demo_repo(tmp_path_factory.mktemp("fp") / "repo")
    # The worktree as staged: the staged regression (an unaccepted keyword) is what gets edited below.
    subprocess.run(["git", "checkout", "-q", "--", "."], cwd=repo, check=True)
    subprocess.run(["git", "clean", "-qfd"], cwd=repo, check=True)
    return repo


def test_unrelated_lines_inserted_and_deleted_change_no_id(demo_repo: Path, tmp_path: Path) -> None:
    before = _review_ids(demo_repo)
    edited = tmp_path / "edited"
    subprocess.run(["cp", "-a", str(demo_repo), str(edited)], check=True)
    for rel in (FI, "vllm_metax/platform.py", "vllm_metax/v1/attention/backends/triton_attn.py"):
        path = edited / rel
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        # three comment lines after the module's first line, one blank line deleted further down
        blank = next(i for i in range(len(lines) // 2, len(lines)) if not lines[i].strip())
        del lines[blank]
        lines[1:1] = ["# unrelated note\n", "# another\n", "\n"]
        path.write_text("".join(lines), encoding="utf-8")
    after = _review_ids(edited)
    assert set(after) == set(before)
    assert any(after[i][1] != before[i][1] for i in before if before[i][0] == FI), "lines did move"


def test_changing_what_a_finding_is_about_changes_its_id(demo_repo: Path, tmp_path: Path) -> None:
    before = _review_ids(demo_repo)
    edited = tmp_path / "edited"
    subprocess.run(["cp", "-a", str(demo_repo), str(edited)], check=True)
    path = edited / FI
    text = path.read_text(encoding="utf-8")
    assert "fixed_split_size=" in text
    path.write_text(text.replace("fixed_split_size=", "fixed_split_sizes="), encoding="utf-8")
    after = _review_ids(edited)
    gone = {i for i in before if i.startswith("MXA101-")} - set(after)
    came = {i for i in after if i.startswith("MXA101-")} - set(before)
    assert gone and came
