# Triage's off-switch demotion (stages/switched_off.py): a finding at a call that runs only with a feature the
# platform turns off on every run is info with the switch and the branch as its gate (vllm-metax v0.22.0's
# MXA512 in cascade_attention, called only after `if not attn_metadata.use_cascade: ... return`, while
# platform.py sets disable_cascade_attn = True). The switch must be unconditional, and every caller gated.
from __future__ import annotations

from metax_audit.core.models import CallSite, Category, ConfigSwitch, Finding, Location, Severity
from metax_audit.stages.switched_off import demote_switched_off

FA = "vllm_npu/attention/flash_attn.py"
MOD = "vllm_npu.attention.flash_attn"
OFF = ConfigSwitch("vllm_config.model_config.disable_cascade_attn", "True", "vllm_config.model_config is not None",
                   Location("vllm_npu/platform.py", 297, "check_and_update_config"))


def _call(line: int, caller: str, callee: str, resolved: str, branch: str = "") -> CallSite:
    return CallSite(Location(FA, line, caller), f"{MOD}.{caller}", callee, resolved, "external", branch=branch)


def _unpacking(line: int = 40) -> Finding:
    return Finding("MXA512", Category.LSE, Severity.ERROR, Location(FA, line, "cascade_attention"),
                   "flash_attn_varlen_func(...) is unpacked as if it returned the LSE")


KERNEL = _call(40, "cascade_attention", "flash_attn_varlen_func", "flash_attn.flash_attn_varlen_func")
GATED = _call(20, "Impl.forward", "cascade_attention", f"{MOD}.cascade_attention", "not (attn_metadata is None) / attn_metadata.use_cascade")
UNGATED = _call(30, "Impl.forward_other", "cascade_attention", f"{MOD}.cascade_attention", "attn_metadata.num_decodes > 0")


def test_a_call_reached_only_from_a_gated_caller_is_info_with_its_gate() -> None:
    [f] = demote_switched_off([_unpacking()], [KERNEL, GATED], [OFF])
    assert f.severity is Severity.INFO
    assert f.evidence[-1] == (
        f"gate: runs only with 'cascade' on (cascade_attention is called only at {FA}:20 under `attn_metadata.use_cascade`); "
        "vllm_npu/platform.py:297 sets vllm_config.model_config.disable_cascade_attn = True on every run (check_and_update_config)")


def test_one_caller_outside_the_feature_keeps_the_error() -> None:
    [f] = demote_switched_off([_unpacking()], [KERNEL, GATED, UNGATED], [OFF])
    assert f.severity is Severity.ERROR


def test_a_function_no_port_code_calls_may_run_from_elsewhere() -> None:
    [f] = demote_switched_off([_unpacking()], [KERNEL], [OFF])
    assert f.severity is Severity.ERROR


def test_a_switch_set_only_for_some_models_demotes_nothing() -> None:
    some = ConfigSwitch(OFF.target, "True", "model_config.is_hybrid", OFF.location)
    assert demote_switched_off([_unpacking()], [KERNEL, GATED], [some])[0].severity is Severity.ERROR


def test_an_import_error_does_not_wait_for_the_call() -> None:
    imp = Finding("MXA122", Category.IMPORT, Severity.ERROR, Location(FA, 40, "cascade_attention"), "module fails to import")
    assert demote_switched_off([imp], [KERNEL, GATED], [OFF])[0].severity is Severity.ERROR


def test_every_unexplained_place_of_a_finding_must_be_behind_the_feature() -> None:
    from dataclasses import replace

    from metax_audit.core.models import Site

    hunks = Finding("MXA201", Category.UNDECLARED_DIFFERENCE, Severity.WARNING, Location(FA, 40, "cascade_attention"),
                    "2 undeclared differences", sites=(Site(FA, 40), Site(FA, 30)))
    open_call = _call(30, "Impl.other", "torch.cat", "torch.cat")  # a method upstream calls: may run
    assert demote_switched_off([hunks], [KERNEL, GATED, open_call], [OFF])[0].severity is Severity.WARNING
    explained = replace(hunks, sites=(Site(FA, 40), Site(FA, 30, verdict="info: the installed signature explains it")))
    assert demote_switched_off([explained], [KERNEL, GATED, open_call], [OFF])[0].severity is Severity.INFO
