# Structural comparison of each port file with its upstream counterpart (and, with a base
# release, of what upstream changed that the port did not follow); differences are classified.
# Steps, in order: load (parse and index each side), structure (two-way: imports, members, bodies),
# classify (what a hunk is and why it is info), three_way (upstream's changes since the base),
# grouping (one finding per root cause); stage runs them per file.
from __future__ import annotations

from metax_audit.stages.compare.counterparts import module_of
from metax_audit.stages.compare.load import compare_dependencies, defined_functions, file_facts
from metax_audit.stages.compare.rules import (
    ACTIONS,
    ARCH_CALLS,
    FOREIGN_PLATFORM_CALLS,
    R_ARCH,
    R_DRIFT,
    R_DRIFT_TAKEN,
    R_UNDECLARED,
    R_UNREADABLE,
    R_VENDOR_ONLY,
)
from metax_audit.stages.compare.stage import compare

__all__ = ["ACTIONS", "ARCH_CALLS", "FOREIGN_PLATFORM_CALLS", "R_ARCH", "R_DRIFT", "R_DRIFT_TAKEN", "R_UNDECLARED",
           "R_UNREADABLE", "R_VENDOR_ONLY", "compare", "compare_dependencies", "defined_functions", "file_facts", "module_of"]
