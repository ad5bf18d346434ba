# Triage of binding findings inside branches the vendor platform never takes (stages/never_taken.py): each
# broken form with the twin that must keep its severity.
from __future__ import annotations

from pathlib import Path

from conftest import write_tree

import metax_audit.stages.checks  # noqa: F401  (registers the rules)
from metax_audit.core.findings import make_finding
from metax_audit.core.models import Finding, Location, Severity, Site
from metax_audit.stages.compare.consequence import read_vendor_platform
from metax_audit.stages.never_taken import demote_never_taken

PLATFORM = ("from vllm.platforms.interface import Platform, PlatformEnum\n\n"
            "class VendorPlatform(Platform):\n    _enum = PlatformEnum.OOT\n")
INDEXER = (
    "from vllm import _custom_ops as ops\nfrom vllm.platforms import current_platform\n\n"
    "def topk(logits, n):\n"
    "    if current_platform.is_cuda() and n in (512, 1024):\n"
    "        ops.persistent_topk(logits)\n"          # line 6: never runs out of tree
    "    else:\n"
    "        ops.top_k_per_row(logits)\n"            # line 8: the branch that runs
    "    ops.top_k_per_row(logits)\n"                # line 9: unconditional
)


def _read(line: int, *more: int, rule: str = "MXA126") -> Finding:
    return make_finding(rule, Location("port/indexer.py", line, "ops.x"), "reads vllm._custom_ops.x, which upstream does not define",
                        ["read: ..."], sites=[Site("port/indexer.py", m, kind="read") for m in more])


def _demote(tmp_path: Path, *findings: Finding) -> list[Severity]:
    write_tree(tmp_path, {"port/platform.py": PLATFORM, "port/indexer.py": INDEXER})
    platform = read_vendor_platform(tmp_path, "port/platform.py")
    return [f.severity for f in demote_never_taken(list(findings), platform, tmp_path)]


def test_a_read_only_inside_a_branch_the_platform_never_takes_is_info(tmp_path: Path) -> None:
    write_tree(tmp_path, {"port/platform.py": PLATFORM, "port/indexer.py": INDEXER})
    [f] = demote_never_taken([_read(6)], read_vendor_platform(tmp_path, "port/platform.py"), tmp_path)
    assert f.severity is Severity.INFO
    gate = f.evidence[-1]
    assert gate.startswith("gate: never runs on the vendor platform: port/indexer.py:6: inside `if current_platform.is_cuda()")
    assert "out-of-tree platform" in gate and "port/platform.py:4" in gate  # the platform class's answer is the evidence


def test_reads_in_the_branch_that_runs_or_outside_any_branch_keep_their_severity(tmp_path: Path) -> None:
    assert _demote(tmp_path, _read(8), _read(9)) == [Severity.ERROR, Severity.ERROR]


def test_every_place_of_a_finding_must_be_in_a_never_taken_branch(tmp_path: Path) -> None:
    assert _demote(tmp_path, _read(6, 6), _read(6, 9)) == [Severity.INFO, Severity.ERROR]


def test_only_rules_whose_consequence_is_at_the_statement(tmp_path: Path) -> None:
    # a graph-capture finding holds whatever path runs; a call bound against a signature does not run there
    capture, call = _read(6, rule="MXA130"), _read(6, rule="MXA101")
    assert capture.severity is not Severity.INFO and call.severity is Severity.ERROR
    assert _demote(tmp_path, capture, call) == [capture.severity, Severity.INFO]
