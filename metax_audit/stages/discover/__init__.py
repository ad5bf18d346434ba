# The discover stage: which port files are in scope, what the port registers (backends, MLA
# prefill backends, custom ops), the platform's priority lists and config switches, and callers.
# scope.py reads the files, registrations.py and platform.py the registrations, priorities and
# switches, stage.py runs them, findings.py judges them.
from __future__ import annotations

from metax_audit.stages.discover.findings import coverage_findings, registration_findings
from metax_audit.stages.discover.stage import discover, widen

__all__ = ["coverage_findings", "discover", "registration_findings", "widen"]
