# Installed-stack introspection: runs the introspect_worker package with the target interpreter in a
# subprocess (a hang or crash of the audited kernel package is a fact), and reads/writes manifests.
# stage.py is the stage, process.py the worker subprocess, cache.py the stack cache, manifest.py
# the facts as JSON.
from __future__ import annotations

from metax_audit.stages.introspect.cache import (
    CachePlan,
    plan_cache,
    prefetch_sys_path,
    stack_cache_dir,
    stack_identity,
    stack_seen,
)
from metax_audit.stages.introspect.manifest import fact_from_json, load_manifest, write_manifest
from metax_audit.stages.introspect.process import Prestarted, prestart, worker_command
from metax_audit.stages.introspect.stage import introspect, stack_targets

__all__ = ["CachePlan", "Prestarted", "fact_from_json", "introspect", "load_manifest", "plan_cache", "prefetch_sys_path", "prestart",
           "stack_cache_dir", "stack_identity", "stack_seen", "stack_targets", "worker_command",
           "write_manifest"]
