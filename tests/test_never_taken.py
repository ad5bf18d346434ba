# Triage of binding findings inside branches the vendor platform never takes (stages/never_taken.py): each
# broken form with the twin that must keep its severity.
from __future__ import annotations

from pathlib import Path

import pytest
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


DISPATCH_PLATFORM = ("from vllm.platforms.interface import Platform, PlatformEnum\n\n"
                     "class VendorPlatform(Platform):\n    _enum = PlatformEnum.OOT\n\n"
                     "    @classmethod\n    def is_device_capability_family(cls, capability, device_id=0):\n        return False\n")
DISPATCH = (
    "from vllm.platforms import current_platform\n\n"
    "def use_fast_prefill():\n"
    "    from vllm.config import get_current_vllm_config\n"
    "    config = get_current_vllm_config()\n"
    "    return config.fast and current_platform.is_device_capability_family(100)\n\n"
    "class Impl:\n"
    "    def __init__(self):\n"
    "        if use_fast_prefill():\n"
    "            self._run = self._run_fast\n"
    "        else:\n"
    "            self._run = self._run_slow\n\n"
    "    def _run_fast(self, q):\n"
    "        from kern import fast_kernel\n"       # line 16: bound only where use_fast_prefill() holds
    "        return fast_kernel(q)\n\n"
    "    def _run_slow(self, q):\n"
    "        from kern import slow_kernel\n"       # line 20: the branch that runs
    "        return slow_kernel(q)\n"
)


def _dispatch(tmp_path: Path, *findings: Finding, other: str = "") -> list[Finding]:
    from metax_audit.stages.compare.predicates import Capability, Evaluator

    write_tree(tmp_path, {"port/platform.py": DISPATCH_PLATFORM, "port/impl.py": DISPATCH, "port/other.py": other})
    platform = read_vendor_platform(tmp_path, "port/platform.py")
    evaluator = Evaluator(platform, Capability.parse("none", "config"), {"port": tmp_path})
    return demote_never_taken(list(findings), platform, tmp_path, evaluator, "port")


def _import(line: int) -> Finding:
    return make_finding("MXA120", Location("port/impl.py", line, "import:kern.x"), "imports x from kern, which installed kern lacks")


def test_a_private_method_bound_only_in_a_never_taken_branch_never_runs(tmp_path: Path) -> None:
    fast, slow = _dispatch(tmp_path, _import(16), _import(20))
    assert (fast.severity, slow.severity) == (Severity.INFO, Severity.ERROR)
    gate = fast.evidence[-1]
    assert "inside Impl._run_fast" in gate and "inside `if use_fast_prefill()` at line 10 (never taken there: " in gate
    assert "port/platform.py:" in gate and "is_device_capability_family" in gate  # the platform's answer is the evidence


def test_a_method_another_port_file_names_is_not_judged(tmp_path: Path) -> None:
    [fast] = _dispatch(tmp_path, _import(16), other="def go(impl):\n    return impl._run_fast(1)\n")
    assert fast.severity is Severity.ERROR


def test_a_file_that_looks_methods_up_by_computed_names_is_not_judged(tmp_path: Path) -> None:
    source = DISPATCH + "\n    def run(self, kind, q):\n        return getattr(self, '_run_' + kind)(q)\n"
    from metax_audit.stages.compare.predicates import Capability, Evaluator

    write_tree(tmp_path, {"port/platform.py": DISPATCH_PLATFORM, "port/impl.py": source})
    platform = read_vendor_platform(tmp_path, "port/platform.py")
    evaluator = Evaluator(platform, Capability.parse("none", "config"), {"port": tmp_path})
    [fast] = demote_never_taken([_import(16)], platform, tmp_path, evaluator, "port")
    assert fast.severity is Severity.ERROR


@pytest.mark.parametrize("test", ["self._use_fast", "self._use_fast and q"])  # one operand decides an `and`
def test_a_self_flag_every_assignment_of_which_is_false_on_the_platform_gates_its_branch(tmp_path: Path, test: str) -> None:
    source = DISPATCH.replace("    def _run_slow(self, q):\n",
                              "    def plan(self, q):\n        self._use_fast = use_fast_prefill()\n"
                              f"        if {test}:\n            from kern import fast_plan\n\n"
                              "    def _run_slow(self, q):\n")
    from metax_audit.stages.compare.predicates import Capability, Evaluator

    write_tree(tmp_path, {"port/platform.py": DISPATCH_PLATFORM, "port/impl.py": source})
    line = source.splitlines().index("            from kern import fast_plan") + 1
    platform = read_vendor_platform(tmp_path, "port/platform.py")
    evaluator = Evaluator(platform, Capability.parse("none", "config"), {"port": tmp_path})
    [f] = demote_never_taken([_import(line)], platform, tmp_path, evaluator, "port")
    assert f.severity is Severity.INFO and "every assignment of self._use_fast in Impl gives it that value" in f.evidence[-1]
    # the twin: another assignment gives the flag True, so the branch may run
    twin = tmp_path / "twin"
    source = source.replace(f"        if {test}:", f"        self._use_fast = True\n        if {test}:")
    write_tree(twin, {"port/platform.py": DISPATCH_PLATFORM, "port/impl.py": source})
    line = source.splitlines().index("            from kern import fast_plan") + 1
    platform = read_vendor_platform(twin, "port/platform.py")
    evaluator = Evaluator(platform, Capability.parse("none", "config"), {"port": twin})
    [f] = demote_never_taken([_import(line)], platform, twin, evaluator, "port")
    assert f.severity is Severity.ERROR
