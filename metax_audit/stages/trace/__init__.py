# The trace stage: per registered backend, the static chain from registration to kernel, every
# call site with its arguments and branch, and the unresolved calls as data (pure ast).
from __future__ import annotations

from metax_audit.stages.trace.chain import trace_backends
from metax_audit.stages.trace.report import kernel_entry_points, trace_findings

__all__ = ["kernel_entry_points", "trace_backends", "trace_findings"]
