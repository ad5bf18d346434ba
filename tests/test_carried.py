# A port-only change the port already had when it moved to the base release (its previous sync) is a vendor
# change carried over: info with the commit as evidence. One made in this sync, or one a release also has,
# keeps its weight. The history is a small git repo written here.
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from conftest import git, write_tree

from metax_audit.core.findings import make_finding
from metax_audit.core.models import Location, Severity, Site
from metax_audit.stages.compare.carried import Carried
from metax_audit.stages.compare.grouping import hunk_line
from metax_audit.stages.triage import triage
from metax_audit.stages.upstream.base_infer import file_at, previous_sync

REL = "port/backends/prefill.py"
UP_REL = "up/backends/prefill.py"
RELEASE = ("class Prefill:\n    def __init__(self, v, qk):\n"
           "        self.pad = v != qk\n        self.v = v\n        self.kind = 'a'\n")
OLD_PORT = ("class Prefill:\n    def __init__(self, v, qk):\n"
            "        self.pad = v != qk or (v == 128 and qk == 192)\n        self.v = v\n        self.kind = 'a'\n")
NEW_PORT = ("class Prefill:\n    def __init__(self, v, qk):\n"
            "        self.pad = v != qk or (v == 128 and qk == 192)\n        self.v = v\n"
            "        self.kind = 'b' if v > 64 else 'a'\n")


def _history(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    write_tree(repo, {"requirements.txt": "up==0.24.0\n", REL: RELEASE})
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "follow 0.24")
    write_tree(repo, {"requirements.txt": "up==0.25.0\n", REL: OLD_PORT})
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "sync to 0.25")
    sync = git(repo, "rev-parse", "HEAD").strip()
    write_tree(repo, {REL: NEW_PORT})
    git(repo, "commit", "-q", "-am", "start the 0.26 sync")
    write_tree(repo, {"requirements.txt": "up==0.26.0\n"})
    git(repo, "commit", "-q", "-am", "declare 0.26")
    return repo, sync


def _carried(tmp_path: Path, repo: Path) -> Carried:
    up, base = write_tree(tmp_path / "up", {UP_REL: RELEASE}), write_tree(tmp_path / "base", {UP_REL: RELEASE})
    point = previous_sync(repo, "HEAD", "0.25.0", "up", "port")
    assert point is not None
    return Carried(repo, up, base, lambda path: file_at(repo, point.commit, path), lambda: point.evidence, "0.25.0", "0.26.0")


def test_the_previous_sync_is_the_commit_that_moved_the_declaration_to_the_base(tmp_path: Path) -> None:
    repo, sync = _history(tmp_path)
    point = previous_sync(repo, "HEAD", "0.25.0", "up", "port")
    assert point is not None and point.commit == sync and "set requirements.txt to 0.25.0" in point.evidence
    assert previous_sync(repo, "HEAD", "0.23.0", "up", "port") is None  # never declared: the history does not say


def test_a_port_only_change_the_previous_sync_had_is_carried_one_made_since_is_not(tmp_path: Path) -> None:
    repo, _ = _history(tmp_path)
    carried = _carried(tmp_path, repo)
    kept = Site(REL, 3, "Prefill.__init__", "changed", "differs at ...", upstream=f"{UP_REL}:3")
    new = Site(REL, 5, "Prefill.__init__", "changed", "differs at ...", upstream=f"{UP_REL}:5")
    assert "carried since the previous sync" in carried.explain(kept) and "sync to 0.25" in carried.explain(kept)
    assert carried.explain(new) == ""  # made in this sync
    assert carried.explain(Site(REL, 3, "Prefill.__init__", "removed", "port drops ...", upstream=f"{UP_REL}:3")) == ""
    f = make_finding("MXA201", Location(REL, 3, "Prefill.__init__"), "2 undeclared differences in Prefill.__init__",
                     [hunk_line(kept), hunk_line(new)], sites=[kept, new])
    (got,) = triage([f], [], None, carried=carried)
    assert got.severity is Severity.WARNING  # the change made in this sync keeps the finding a warning
    assert got.location.line == 5 and "at line 5" in got.message  # and it leads now
    (only_kept,) = triage([make_finding("MXA201", Location(REL, 3, "Prefill.__init__"), "changed in Prefill.__init__",
                                        [hunk_line(kept)], sites=[kept])], [], None, carried=carried)
    assert only_kept.severity is Severity.INFO


def test_a_carried_statement_next_to_one_made_since_is_judged_with_it(tmp_path: Path) -> None:
    # the statements of one hunk are carried only all together: a new one beside it keeps the hunk's weight
    repo, _ = _history(tmp_path)
    write_tree(repo, {REL: NEW_PORT.replace("        self.v = v\n", "        self.v = v + 1\n")})
    site = Site(REL, 3, "Prefill.__init__", "changed", "differs at ...", upstream=f"{UP_REL}:3")
    assert _carried(tmp_path, repo).explain(site) == ""


def test_a_change_a_release_also_has_is_not_the_ports_own(tmp_path: Path) -> None:
    repo, _ = _history(tmp_path)
    carried = _carried(tmp_path, repo)
    write_tree(tmp_path / "base", {UP_REL: OLD_PORT})  # the base release has the port's text: drift, not the port's
    site = Site(REL, 3, "Prefill.__init__", "changed", "differs at ...", upstream=f"{UP_REL}:3")
    assert carried.explain(site) == ""


def test_a_function_the_port_writes_itself_is_carried_whole(tmp_path: Path) -> None:
    repo, _ = _history(tmp_path)
    carried = _carried(tmp_path, repo)
    own = "def has_kernel():\n    return True\n"
    write_tree(repo, {REL: NEW_PORT + "\n\n" + own})
    git(repo, "commit", "-q", "-am", "answer has_kernel")
    line = NEW_PORT.count("\n") + 3
    site = Site(REL, line, "has_kernel", "changed", "the port defines has_kernel itself", upstream=f"{UP_REL}:1")
    assert carried.explain(site) == ""  # written in this sync
    sync_text = OLD_PORT + "\n\n" + own
    old = Carried(carried.port_root, carried.upstream_root, carried.base_root, lambda path: sync_text, lambda: "abc1234 (sync)",
                  "0.25.0", "0.26.0")
    assert "the port had the same has_kernel" in old.explain(site)


def test_a_call_that_follows_the_ports_own_signature(tmp_path: Path) -> None:
    from metax_audit.stages.triage import _follows_own_signature

    port = write_tree(tmp_path / "p", {"p/x.py": "def plan(w, indptr, seq_lens):\n    return w\n\nplan(1, 2, seq_lens=3)\n"})
    up = write_tree(tmp_path / "u", {"u/x.py": "def plan(w, indptr):\n    return w\n\nplan(1, 2)\n"})
    site = Site("p/x.py", 4, "<module>", "call-changed", "plan(+seq_lens)", upstream="u/x.py:4", keywords=("plan:+seq_lens",))
    assert "follows the port's own plan (p/x.py:1), whose signature adds seq_lens" in _follows_own_signature(site, (port, up), "u/x.py")
    other = replace(site, keywords=("plan:+window",))  # a keyword its own signature does not add: not explained
    assert _follows_own_signature(other, (port, up), "u/x.py") == ""
