# One finding per root cause, every site kept (triage): a file the last sync left behind, the import error
# that is its symptom, the upstream additions that stand alone. Findings built by hand, as compare writes them.
from __future__ import annotations

from metax_audit.core.models import Category, Finding, Location, Severity, Site
from metax_audit.stages.checks.imports import REMOVED_SINCE_BASE
from metax_audit.stages.triage import group_left_behind

PATH = "port/backends/fi.py"


def _drift(line: int, symbol: str, change: str = "changed") -> Finding:
    return Finding("MXA203", Category.UPSTREAM_DRIFT, Severity.WARNING, Location(PATH, line, symbol), f"{symbol}: not followed",
                   (f"{PATH}:{line} [upstream-not-followed] x -- may change what a kernel computes or whether it runs",),
                   sites=(Site(PATH, line, symbol, "upstream-not-followed", "x", "", "", change),))


def _import_error(removed: bool) -> Finding:
    return Finding("MXA122", Category.IMPORT, Severity.ERROR, Location(PATH, 50, "import:up.utils:gone"),
                   "imports 'gone' from up.utils, which upstream 2.0 does not define",
                   ("port: fi.py:50", *([REMOVED_SINCE_BASE] if removed else [])), sites=(Site(PATH, 50, "", "import"),))


def test_the_functions_a_sync_left_behind_are_one_finding_listing_each_function():
    found = group_left_behind([_drift(10, "B.shape"), _drift(40, "I.forward"), _drift(90, "I.update")])
    assert [f.rule for f in found] == ["MXA209"]
    assert [(s.line, s.symbol) for s in found[0].sites] == [(10, "B.shape"), (40, "I.forward"), (90, "I.update")]
    assert len(found[0].joined) == 3  # a baseline does not call the three drift findings fixed


def test_an_upstream_addition_stands_alone():
    found = group_left_behind([_drift(10, "B.shape"), _drift(40, "I.forward"), _drift(60, "B.supports_window", "method-added"),
                               _drift(70, "M.workspace", "statements-added")])
    assert sorted(f.rule + ":" + f.location.symbol for f in found) == ["MXA203:B.supports_window", "MXA203:M.workspace", "MXA209:file"]


def test_the_old_form_joins_the_import_of_a_name_upstream_removed_since_the_base():
    found = group_left_behind([_import_error(True), _drift(10, "B.shape"), _drift(40, "I.forward")])
    assert [f.rule for f in found] == ["MXA122"]
    assert {(s.line, s.symbol) for s in found[0].sites} >= {(50, ""), (10, "B.shape"), (40, "I.forward")}
    assert any(e.startswith("root cause, also the file's old form") for e in found[0].evidence)


def test_an_import_error_of_another_cause_stays_apart():
    found = group_left_behind([_import_error(False), _drift(10, "B.shape"), _drift(40, "I.forward")])
    assert sorted(f.rule for f in found) == ["MXA122", "MXA209"]


def test_a_file_whose_sync_followed_something_is_not_left_behind():
    followed = Finding("MXA204", Category.UPSTREAM_DRIFT, Severity.INFO, Location(PATH, 5, "B.x"), "followed")
    found = group_left_behind([followed, _drift(10, "B.shape"), _drift(40, "I.forward")])
    assert sorted(f.rule for f in found) == ["MXA203", "MXA203", "MXA204"]


def _drops(path: str, line: int, symbol: str, *keywords: str, live_other: bool = False) -> Finding:
    sites = [Site(path, line, symbol, "call-changed", "kernel(-a)", "", "", "", tuple(keywords))]
    if live_other:
        sites.append(Site(path, line + 5, symbol, "changed", "x = 2 * y"))
    return Finding("MXA201", Category.UNDECLARED_DIFFERENCE, Severity.WARNING, Location(path, line, symbol), f"{symbol}: differs",
                   sites=tuple(sites))


def test_one_callee_left_without_upstream_keywords_at_n_sites_is_one_finding():
    from metax_audit.stages.triage import group_keyword_drops

    found = group_keyword_drops([_drops("a.py", 10, "A.f", "kernel:-fa_version"), _drops("b.py", 20, "B.g", "mod.kernel:-fa_version",
                                                                                        "mod.kernel:-q_descale"),
                                 _drops("c.py", 30, "C.h", "kernel:-fa_version", live_other=True)])
    assert sorted(f.rule for f in found) == ["MXA201", "MXA212"]  # C.h changes more than the keywords: its own finding
    grouped = next(f for f in found if f.rule == "MXA212")
    assert {x.path for x in grouped.sites} == {"a.py", "b.py"} and "fa_version, q_descale" in grouped.message


def test_a_difference_only_an_unselected_backend_runs_is_info_with_that_gate():
    from metax_audit.core.models import BackendChain, ChainHop
    from metax_audit.stages.triage import demote_unselected

    idle = BackendChain("IDLE", "port.idle.B", None, False, (ChainHop("backend", "port.idle.B", "port/idle.py", 1),), (), ())
    used = BackendChain("USED", "port.used.B", None, True, (ChainHop("backend", "port.used.B", "port/used.py", 1),
                                                            ChainHop("impl", "port.shared.I", "port/shared.py", 1)), (), ())
    also = BackendChain("IDLE2", "port.idle2.B", None, False, (ChainHop("impl", "port.shared.I", "port/shared.py", 1),), (), ())
    diffs = [Finding("MXA201", Category.UNDECLARED_DIFFERENCE, Severity.WARNING, Location(p, 5, "f"), "differs")
             for p in ("port/idle.py", "port/shared.py")]
    got = demote_unselected(diffs, [idle, used, also])
    assert [f.severity for f in got] == [Severity.INFO, Severity.WARNING]  # a file an active backend reaches stays
    assert any("the platform never selects it" in e for e in got[0].evidence)


def test_one_change_said_of_several_classes_is_one_finding():
    from metax_audit.stages.triage import group_same_message

    def renamed(cls: str, path: str) -> Finding:
        return Finding("MXA207", Category.SIGNATURE, Severity.WARNING, Location(path, 9, f"{cls}.shape"),
                       f"{cls}.shape overrides Base.shape but renames `a` to `b`, which upstream callers pass by keyword")
    got = group_same_message([renamed("FaBackend", "fa.py"), renamed("MlaBackend", "mla.py"), renamed("Other", "o.py")])
    assert len(got) == 1 and [x.path for x in got[0].sites] == ["fa.py", "mla.py", "o.py"]
    assert got[0].message.endswith("(the same in 2 more: MlaBackend.shape, Other.shape)")
