# The explicit registry of the record types a cache entry may hold (cache/codec.py decodes into these
# and nothing else). Named as strings and imported on first use, so the cache imports no stage.
"""A type missing here is not an error of a review: its entry is not written (the codec refuses it)
and the result is computed each time; tests/test_cache_store.py runs the demo and fails on any entry
the codec refused, and checks that each name below resolves to a dataclass, enum or named tuple."""

from __future__ import annotations

import functools
import importlib

from metax_audit.cache.codec import Registry

RECORDS: dict[str, tuple[str, ...]] = {
    "metax_audit.core.models": (
        "AuditReport", "BackendChain", "BaselineState", "CallArg", "CallSite", "Category", "ChainHop",
        "ConfigSwitch", "Coverage", "Difference", "Discovery", "FileComparison", "FileRecord", "Finding",
        "FlowEnd", "FlowStep", "InstalledSignature", "Location", "LseFlow", "ParseProblem", "ParseProblemKind",
        "PriorityList", "ProbeEvidence", "ProbeRequest", "ProbeResult", "Registration", "Severity", "Site", "SkippedFile", "SnapshotInfo", "SourceFile",
        "StageRecord", "TestRun", "UnboundPackage", "Unresolved", "UnresolvedKind", "UpstreamCaller", "UpstreamInfo",
    ),
    "metax_audit.core.config": ("AuditConfig",),
    "metax_audit.pipeline.incremental": ("RevisionEntry",),
    "metax_audit.core.comments": ("Comment", "CommentMap", "ModificationBlock"),
    "metax_audit.stages.compare.consequence": ("VendorPlatform",),
    "metax_audit.core.contracts": ("Contracts", "Convention", "Flag", "Observation", "ProbeRef"),
    "metax_audit.core.pysource": ("ImportedName",),
    "metax_audit.stages.discover.registrations": ("_Bind", "_From"),
    "metax_audit.stages.trace.memo": ("UnitResult",),
    "metax_audit.stages.trace.modules": ("Skip",),
    "metax_audit.stages.trace.symbols": ("NameAnswer", "Provider", "Status"),
    "metax_audit.stages.compare.memo": ("_Entry",),
    "metax_audit.stages.compare.three_way": ("_Change",),
    "metax_audit.stages.checks.attributes": ("_ClassFacts",),
    "metax_audit.stages.checks.graph_capture": ("_Hit",),
    "metax_audit.stages.checks.imports": ("Guard", "ImportSite", "_MissingAt"),
    "metax_audit.stages.checks.op_registrations": ("OpRegistration", "OpUse"),
    "metax_audit.stages.checks.passthrough": ("ForwardedOp",),
    "metax_audit.stages.checks.names": ("FreeName",),
    "metax_audit.stages.checks.compiled_calls": ("CompiledCall",),
    "metax_audit.stages.dataflow.analysis": ("Recorder", "ScopeEntry"),
    "metax_audit.stages.dataflow.facts": ("ScaleArgument", "ScaleCall", "Unpacking"),
}


@functools.cache
def registry() -> Registry:
    reg = Registry()
    for module, names in RECORDS.items():
        mod = importlib.import_module(module)
        reg.add(*(getattr(mod, name) for name in names))
    return reg
