# The probe stage: runs each probe of the top-level `probes` package in its own subprocess (so a
# crashing or hanging kernel is a recorded result), maps backends/traces to targets, and files findings.
# targets.py picks what to probe, run.py runs it, findings.py judges the results, device_report.py
# writes the report of a device run, __main__.py is that run's entry point.
from __future__ import annotations

from metax_audit.stages.probing.device_report import render_markdown, results_json, write_probe_reports
from metax_audit.stages.probing.findings import probe_findings
from metax_audit.stages.probing.run import (
    NO_DEVICE,
    from_outcome,
    probe_line,
    run_jobs,
    run_many,
    run_probes,
    run_targets,
)
from metax_audit.stages.probing.targets import FAMILIES, PROBES, applicable, backend_targets, targets_from_trace

__all__ = ["FAMILIES", "NO_DEVICE", "PROBES", "applicable", "backend_targets", "from_outcome", "probe_findings",
           "probe_line", "render_markdown", "results_json", "run_jobs", "run_many", "run_probes", "run_targets",
           "targets_from_trace", "write_probe_reports"]
