# metax-audit: audits a vendor port of vLLM's attention backends (trace, introspect, compare,
# probe, report). The public surface is re-exported here; heavy imports stay inside functions.
from __future__ import annotations

__version__ = "0.1.0"

from metax_audit.errors import AuditError
from metax_audit.models import AuditReport, Category, Finding, Location, Severity

__all__ = ["AuditError", "AuditReport", "Category", "Finding", "Location", "Severity", "__version__"]
