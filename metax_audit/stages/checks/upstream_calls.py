# Call sites of the upstream counterparts of the compared port files, traced like the port (the
# signature check compares positional arguments of the same callee on both sides).
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from metax_audit.core.config import AuditConfig
from metax_audit.core.memo import NO_MEMO, Kind, Memo
from metax_audit.core.models import CallSite, Comparison, Discovery, UpstreamInfo


def upstream_calls(comparison: Comparison | None, upstream: UpstreamInfo | None, config: AuditConfig, *,
                   memo: Memo = NO_MEMO, callers: frozenset[str] | None = None) -> Sequence[CallSite]:
    """Call sites of the upstream counterparts, so a positional argument whose meaning moved
    between upstream's call and the port's call of the same callee can be seen. With `callers`, those
    in functions and methods of these names only (the signature check matches a port call with upstream's
    calls from a function of its caller's name: signatures.checked_callers)."""
    if comparison is None or upstream is None or upstream.root is None or callers == frozenset():
        return ()
    from metax_audit.core.models import SourceFile
    from metax_audit.stages.trace import trace_backends

    paths = sorted({f.upstream_path for f in comparison.files if f.upstream_path})
    if not paths:
        return ()
    files = tuple(SourceFile(p, p[:-3].replace("/", "."), "counterpart") for p in paths if (upstream.root / p).is_file())
    up_discovery = Discovery(root=upstream.root, port_package=config.upstream_package, files=files, registrations=(),
                             priorities=(), switches=(), callers={})
    up_config = replace(config, port_package=config.upstream_package)
    # They depend on the upstream release, the counterparts and the config only: kept per upstream.
    parts = (upstream, [f.path for f in files], repr(up_config), None if callers is None else sorted(callers))
    kept = memo.load(Kind.UPSTREAM_CALLS, *parts)
    if isinstance(kept, tuple):
        return kept
    calls = tuple(trace_backends(up_discovery, up_config, None, only_functions=callers).calls)
    memo.store(Kind.UPSTREAM_CALLS, calls, *parts)
    return calls

