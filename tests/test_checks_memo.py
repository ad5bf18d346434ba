# The checks' per-file memo (checks/memo.py): a unit is read back only for the same bytes of the
# same file; a changed file, another unit key or --no-cache computes it again.
from __future__ import annotations

from pathlib import Path

from metax_audit.cache.memo import review_memo
from metax_audit.stages.checks.memo import FileMemo


def _review(root: Path, unit: tuple[str, ...], *, enabled: bool = True) -> tuple[list[str], FileMemo]:
    memo = FileMemo(root, memo=review_memo(enabled))
    calls: list[str] = []

    def compute(path: str) -> str:
        calls.append(path)
        return (root / path).read_text()

    values = [memo.get(p, unit, lambda p=p: compute(p)) for p in ("a.py", "b.py")]
    memo.save()
    assert values == [(root / p).read_text() for p in ("a.py", "b.py")]
    return calls, memo


def test_a_unit_is_read_back_for_the_same_bytes_only(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 2\n")
    assert _review(tmp_path, ("u",))[0] == ["a.py", "b.py"]
    calls, memo = _review(tmp_path, ("u",))
    assert calls == [] and memo.describe() == "per-file memo: 2 reused, 0 computed"
    (tmp_path / "b.py").write_text("y = 3\n")
    assert _review(tmp_path, ("u",))[0] == ["b.py"]
    assert _review(tmp_path, ("u", "other packages"))[0] == ["a.py", "b.py"]  # the unit's own inputs are its key
    assert _review(tmp_path, ("u",))[0] == []  # both units kept in one record per file


def test_disabled_memo_computes_everything_and_keeps_nothing(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 2\n")
    calls, memo = _review(tmp_path, ("u",), enabled=False)
    assert calls == ["a.py", "b.py"] and memo.describe() == ""
    assert _review(tmp_path, ("u",))[0] == ["a.py", "b.py"]


def test_a_unit_asked_twice_in_one_review_is_computed_once_and_not_reused(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    memo = FileMemo(tmp_path, memo=review_memo(True))
    calls: list[int] = []
    assert [memo.get("a.py", ("u",), lambda: calls.append(1) or len(calls)) for _ in range(2)] == [1, 1]
    assert calls == [1] and (memo.hits, memo.misses) == (0, 1) and memo.describe() == ""
