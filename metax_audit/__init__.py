# metax-audit: audits a vendor port of vLLM's attention backends (trace, introspect, compare,
# probe, report). The public surface is re-exported here; heavy imports stay inside functions.
from __future__ import annotations

__version__ = "0.1.0"


def _drop_callers_cwd() -> None:
    """`python -m metax_audit` puts the caller's cwd first on sys.path, so a json.py or torch.py in
    the audited repo would be imported by our own process: drop that entry before any other import
    (unless this package itself was found there, as in a checkout of metax-audit)."""
    import os
    import sys

    if sys.argv[:1] != ["-m"] or sys.flags.safe_path:
        return
    cwd = os.getcwd()
    home = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != cwd or cwd == home]


_drop_callers_cwd()

from metax_audit.core.errors import AuditError  # noqa: E402 (after the sys.path guard above)
from metax_audit.core.models import AuditReport, Category, Finding, Location, Severity  # noqa: E402 (idem)

__all__ = ["AuditError", "AuditReport", "Category", "Finding", "Location", "Severity", "__version__"]
