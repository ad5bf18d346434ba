# The core of the commands other than review (trace, probe, evidence, contracts): each takes the
# parsed options, runs the stages it needs in the review's order, and returns what the CLI renders.
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metax_audit.core.config import AuditConfig, load_config
from metax_audit.core.contracts import default_contracts_path
from metax_audit.core.errors import AuditError
from metax_audit.core.models import (
    BackendChain,
    Discovery,
    ProbeResult,
    SnapshotInfo,
    SnapshotMode,
    TraceResult,
    UpstreamInfo,
)
from metax_audit.stages.snapshot import port_package_hint, static_export

if TYPE_CHECKING:
    from metax_audit.core.contracts import ContractCheck, Contracts


@contextmanager
def _traced(mode: SnapshotMode | None, repo: Path | None, rev: str | None, upstream: str | None,
            config_file: Path | None = None,
            ) -> Iterator[tuple[SnapshotInfo, AuditConfig, Discovery, TraceResult, UpstreamInfo | None]]:
    """snapshot -> discover -> trace, as the review does them, for the commands that need only a trace
    (`trace`, `evidence --capture-stack`); the snapshot lives while the block runs."""
    from metax_audit.stages import discover as discover_mod
    from metax_audit.stages import snapshot as snapshot_mod
    from metax_audit.stages import trace as trace_mod

    if mode is None:
        mode, rev, _ = snapshot_mod.default_mode(repo)
    package = port_package_hint(repo, mode, config_file)
    with snapshot_mod.snapshot(mode, repo, rev, package=package, only=static_export(package)) as snap:
        config = load_config(snap.root, config_file)
        discovery = discover_mod.discover(snap.root, config)
        up = None
        if upstream:
            from metax_audit.stages.upstream import resolve_upstream

            up = resolve_upstream(upstream, package=config.upstream_package)
        yield snap, config, discovery, trace_mod.trace_backends(discovery, config, up.root if up else None), up


def trace_only(*, mode: SnapshotMode | None, repo: Path | None, rev: str | None, upstream: str | None,
               backend: str, config: Path | None = None) -> list[BackendChain]:
    """`metax-audit trace`: the chains asked for (a backend name, a class name, or "all")."""
    with _traced(mode, repo, rev, upstream, config) as (_, _, _, result, _):
        pass
    if backend.lower() == "all":
        chains = list(result.backends)
    else:
        chains = [c for c in result.backends if c.name.lower() == backend.lower()
                  or c.class_path.rsplit(".", 1)[-1].lower() == backend.lower()]
    if not chains:
        from collections import Counter

        # a name registered to several classes (FLASH_ATTN of two attention types) is listed once
        counts = Counter(c.name for c in result.backends)
        names = ", ".join(f"{n} ({k} classes)" if k > 1 else n for n, k in sorted(counts.items())) or "none"
        raise AuditError(f"no registered backend named {backend!r} (registered: {names})")
    return chains


def probe(*, backend: str | None, target: str | None, family: str | None, probes: Sequence[str], device: str,
          python: str | None, output_dir: Path, timeout: float,
          options: Mapping[str, str] | None = None) -> tuple[list[ProbeResult], list[Path]]:
    """`metax-audit probe`: pick targets, run each target's probes in one worker subprocess, write the results."""
    from metax_audit.stages import probing
    from metax_audit.stages.probing import evidence as evidence_mod

    pairs = [(target, family or "")] if target else probing.backend_targets(backend or "")
    if not pairs:
        raise AuditError(f"no probe targets known for backend {backend!r}")
    results = probing.run_targets(pairs, probes=probes, device=device, timeout=timeout, python=python, options=options)
    env = evidence_mod.collect_environment(python=python)
    written = probing.write_probe_reports(results, env, output_dir)
    return results, written


def evidence(*, python: str | None, save: Path | None, capture_stack: Path | None, repo: Path | None,
             mode: SnapshotMode | None, rev: str | None, upstream: str | None = None,
             config: Path | None = None) -> tuple[dict[str, Any], list[str], Path | None]:
    """`metax-audit evidence`: the environment record, compared with a saved one; optionally the stack manifest."""
    from metax_audit.stages.probing import evidence as evidence_mod

    env = evidence_mod.collect_environment(python=python)
    changes: list[str] = []
    if save is not None:
        if save.exists():
            changes = evidence_mod.diff_environment(evidence_mod.load_environment(save), env)
        evidence_mod.save_environment(env, save)
    if capture_stack is not None:
        from metax_audit.stages import introspect as introspect_mod

        with _traced(mode, repo, rev, upstream, config) as (snap, audit_config, discovery, result, up):
            targets = introspect_mod.stack_targets(discovery, result, audit_config.kernel_modules)
            roots = (snap.root, *((up.root,) if up and up.root else ()))
            facts = introspect_mod.introspect(targets, python=python, static_roots=roots,
                                              never_import=(audit_config.port_package,))
        introspect_mod.write_manifest(facts, capture_stack)
    return env, changes, capture_stack


def contracts(*, path: Path | None, check: bool, python: str | None) -> tuple[Contracts, list[ContractCheck]]:
    """`metax-audit contracts`: list observations; with check, rerun each observation's probe here."""
    from metax_audit.core import contracts as contracts_mod

    file = path or default_contracts_path()
    if not file.is_file():
        raise AuditError(f"contracts file {file} not found (pass --file)")
    loaded = contracts_mod.load_contracts(file)
    checks: list[ContractCheck] = []
    if check:
        from metax_audit.stages import probing
        from metax_audit.stages.probing import evidence as evidence_mod

        env = evidence_mod.collect_environment(python=python)
        installed = {k: v.get("version", "") if isinstance(v, dict) else str(v)
                     for k, v in env.get("packages", {}).items()}

        def run_probe(target: str, family: str, probe_name: str) -> ProbeResult:
            return probing.run_probes(target=target, family=family, probes=(probe_name,), python=python)[0]

        checks = contracts_mod.check_contracts(loaded, run_probe=run_probe, installed_versions=installed)
    return loaded, checks
