# The compare of the discovery as discover left it, run in a forked child during the trace of a review
# with no prediction (incremental.SpeculativeCompare), equals the compare of the discovery the trace
# widened: a file whose import could name a module the widening added is compared again, the rest reused.
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from metax_audit.core.forked import Forked
from metax_audit.core.memo import NO_MEMO

OPS = "vllm_metax/v1/attention/ops/triton_unified_attention.py"
USER = "vllm_metax/v1/attention/backends/triton_attn.py"


def _port(tmp_path: Path) -> Path:
    """The demo port whose Triton backend imports the port's own copy of upstream's kernel module."""
    from metax_audit import demo as demo_mod

    repo = demo_mod.build_demo_repo(tmp_path / "port")
    user = repo / USER
    text = user.read_text()
    old = "from vllm.v1.attention.ops.triton_unified_attention import unified_attention"
    assert old in text
    user.write_text(text.replace(old, old.replace("from vllm.", "from vllm_metax."), 1))
    (repo / OPS).write_text("def unified_attention(q, k, v, out, **kwargs):\n    return out\n")
    return repo


def _kinds(comparison: object, path: str) -> list[str]:
    [fc] = [f for f in comparison.files if f.path == path]  # type: ignore[attr-defined]
    return sorted(d.kind for d in fc.differences if "unified_attention" in d.symbol + d.detail)


def test_the_speculative_compare_equals_the_compare_of_the_widened_discovery(tmp_path: Path, audit_cache: Path) -> None:
    from metax_audit import demo as demo_mod
    from metax_audit.core.config import load_config
    from metax_audit.pipeline.incremental import SpeculativeCompare
    from metax_audit.stages import discover
    from metax_audit.stages.compare.per_file import cached_compare
    from metax_audit.stages.upstream import resolve_upstream

    repo = _port(tmp_path)
    config = load_config(repo)
    up = resolve_upstream(str(demo_mod.upstream_root()))
    found = discover.discover(repo, config)
    before = replace(found, files=tuple(f for f in found.files if f.path != OPS))  # as if only the trace reaches it
    widened = discover.widen(before, repo, [OPS])
    assert OPS in {f.path for f in widened.files} and OPS not in {f.path for f in before.files}

    direct, direct_findings, _ = cached_compare(widened, config, up, memo=NO_MEMO)
    ahead = SpeculativeCompare(Forked, before, config, up, None, NO_MEMO)
    got = ahead.take(widened, (up, None), NO_MEMO)
    assert got is not None
    comparison, findings, work = got
    assert comparison == direct and [(f.id, f.content) for f in findings] == [(f.id, f.content) for f in direct_findings]
    # the file importing the added module and the added file were compared here; every other one came from the child
    assert (work.files, work.ahead) == (2, len(before.files) - 1)
    # and that mattered: with the narrower scope the import reads differently
    narrow, _, _ = cached_compare(before, config, up, memo=NO_MEMO)
    assert _kinds(narrow, USER) != _kinds(direct, USER), (_kinds(narrow, USER), _kinds(direct, USER))


def test_a_speculative_compare_of_other_releases_or_files_is_not_used(tmp_path: Path, audit_cache: Path) -> None:
    from metax_audit import demo as demo_mod
    from metax_audit.core.config import load_config
    from metax_audit.pipeline.incremental import SpeculativeCompare
    from metax_audit.stages import discover
    from metax_audit.stages.upstream import resolve_upstream

    repo = _port(tmp_path)
    config = load_config(repo)
    up = resolve_upstream(str(demo_mod.upstream_root()))
    found = discover.discover(repo, config)
    other = replace(found, files=tuple(f for f in found.files if f.path != USER))  # a file gone: not a widening
    assert SpeculativeCompare(Forked, found, config, up, None, NO_MEMO).take(other, (up, None), NO_MEMO) is None
    assert SpeculativeCompare(Forked, found, config, up, None, NO_MEMO).take(found, (None, None), NO_MEMO) is None
    same = SpeculativeCompare(Forked, found, config, up, None, NO_MEMO).take(found, (up, None), NO_MEMO)
    assert same is not None and (same[2].files, same[2].ahead) == (0, len(found.files))


def test_where_fork_is_refused_nothing_is_speculated(tmp_path: Path, audit_cache: Path) -> None:
    """Forked refuses beside another thread; the compare stage then computes everything itself."""
    import threading

    from metax_audit import demo as demo_mod
    from metax_audit.core.config import load_config
    from metax_audit.pipeline.incremental import SpeculativeCompare
    from metax_audit.stages import discover
    from metax_audit.stages.upstream import resolve_upstream

    repo = _port(tmp_path)
    config = load_config(repo)
    up = resolve_upstream(str(demo_mod.upstream_root()))
    found = discover.discover(repo, config)
    hold = threading.Event()
    beside = threading.Thread(target=hold.wait)
    beside.start()
    try:
        ahead = SpeculativeCompare(Forked, found, config, up, None, NO_MEMO)
    finally:
        hold.set()
        beside.join()
    assert ahead.child is not None and not ahead.child.started
    assert ahead.take(found, (up, None), NO_MEMO) is None
