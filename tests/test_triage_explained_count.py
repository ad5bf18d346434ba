# An MXA201 finding whose lead hunk is explained leads with what remains, and its two counts (left, explained)
# add up to the hunks it lists (a hunk the compare already explained counts as explained too); the first screen
# counts the places the same way.
from dataclasses import replace

import metax_audit.stages.compare.rules  # noqa: F401  (registers MXA201)
from metax_audit.core.findings import make_finding
from metax_audit.core.models import Location, Severity, Site
from metax_audit.stages.compare.grouping import hunk_line
from metax_audit.stages.triage import _with_sites


def _finding(sites: list[Site]):
    return make_finding("MXA201", Location("p/a.py", sites[0].line, "Impl.forward"), "3 undeclared differences",
                        [hunk_line(s) for s in sites], Severity.WARNING, sites=sites)


def test_counts_of_left_and_explained_add_up_to_the_hunks():
    before = [Site("p/a.py", 10, "Impl.forward", "call-changed", "kernel(-out)"),
              Site("p/a.py", 20, "Impl.forward", "added", "x = 1"),
              Site("p/a.py", 30, "Impl.forward", "feature-disabled", "assert y", verdict="info: the port rejects this case"),
              Site("p/a.py", 40, "Impl.forward", "changed", "z = 2")]
    after = [replace(before[0], verdict="info: the installed kernel has no out"), *before[1:]]
    found = _with_sites(_finding(before), after)
    assert found.severity == Severity.WARNING
    assert found.message.startswith("2 undeclared differences left in Impl.forward (2 explained:")
    assert found.location.line == 20
    assert hunk_line(after[0]) in found.evidence  # the explained hunk's evidence line is rendered again


def test_the_first_screen_counts_the_places_left_and_the_explained_apart():
    from metax_audit.report.first_screen import statement

    sites = [Site("p/a.py", 10, "Impl.forward", "call-changed", "kernel(-out)", verdict="info: the installed kernel has no out"),
             Site("p/a.py", 20, "Impl.forward", "added", "x = 1"),
             Site("p/a.py", 30, "Impl.forward", "changed", "z = 2")]
    found = _finding(sites)
    found = replace(found, message="differs at ...x [upstream: a | port: b]")  # quotes code: the short form is shown
    assert statement(found).endswith("Impl.forward (2 places left, 1 explained)")
    assert statement(replace(found, sites=tuple(replace(x, verdict="") for x in sites))).endswith("(3 places)")
