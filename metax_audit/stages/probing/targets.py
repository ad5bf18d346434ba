# Which probes apply to a kernel family, and the probe targets (kernel adapter, family) of a backend
# by name or of a traced backend chain.
from __future__ import annotations

from collections.abc import Mapping

from metax_audit.core.errors import ProbeError
from metax_audit.core.models import BackendChain

BUILTIN_PROBES = ("lse", "layout", "fp8-scale", "dcp", "query-count", "padding", "graph-capture")
BUILTIN_FAMILIES = ("paged-decode", "paged-prefill", "ragged-prefill", "merge-states", "dcp-local-seq-lens")


def _discover() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Probes and families the `probes` package provides (h2o joins when present); the built-in
    lists when the package cannot be imported here (it runs in the target interpreter anyway)."""
    try:
        from metax_audit.probes.registry import registry

        reg = registry()
        probes = tuple(dict.fromkeys((*BUILTIN_PROBES, *reg.probes)))
        families = tuple(dict.fromkeys((*BUILTIN_FAMILIES, *reg.families)))
        return probes, families
    except Exception:
        return BUILTIN_PROBES, BUILTIN_FAMILIES


PROBES, FAMILIES = _discover()

# Which probes apply to which family (the CLI's default probe list for a target).
APPLIES: dict[str, tuple[str, ...]] = {
    "paged-decode": ("lse", "layout", "fp8-scale", "dcp", "padding", "graph-capture"),
    "paged-prefill": ("lse", "layout", "fp8-scale", "query-count", "padding"),
    "ragged-prefill": ("lse", "layout", "fp8-scale", "query-count", "padding"),
    "merge-states": ("lse", "dcp"),
    "dcp-local-seq-lens": ("dcp",),
}



def applicable(family: str) -> tuple[str, ...]:
    """The probes that apply to a family: the built-in table, else what the probe modules declare
    (an add-on family such as h2o-scores)."""
    if family in APPLIES:
        return APPLIES[family]
    try:
        from metax_audit.probes.registry import registry

        return tuple(n for n, p in registry().probes.items() if family in p.families)
    except Exception:
        return ()


_BACKENDS: dict[str, list[tuple[str, str]]] = {
    "flashinfer": [
        ("flashinfer:BatchDecodeWithPagedKVCacheWrapper", "paged-decode"),
        ("flashinfer:BatchPrefillWithPagedKVCacheWrapper", "paged-prefill"),
        ("flashinfer:BatchPrefillWithRaggedKVCacheWrapper", "ragged-prefill"),
        ("flashinfer:merge_state", "merge-states"),
    ],
    "torch-reference": [
        ("torch-reference", "paged-decode"),
        ("torch-reference", "paged-prefill"),
        ("torch-reference", "ragged-prefill"),
        ("torch-reference:base-e", "merge-states"),
        ("torch-reference", "dcp-local-seq-lens"),
    ],
}
_NO_ADAPTER = {
    "triton": "vLLM's Triton attention ops have no built-in adapter yet; probe one with --target MOD:CALLABLE --family paged-decode",
    "flash_attn": "flash-attn has no built-in adapter yet; probe it with --target MOD:CALLABLE --family ragged-prefill",
}

# Resolved callee name (suffix) -> (built-in target, family), for targets_from_trace.
_TRACE_MAP = (
    ("BatchDecodeWithPagedKVCacheWrapper", _BACKENDS["flashinfer"][0]),
    ("BatchPrefillWithPagedKVCacheWrapper", _BACKENDS["flashinfer"][1]),
    ("BatchPrefillWithRaggedKVCacheWrapper", _BACKENDS["flashinfer"][2]),
    ("flashinfer.merge_state", _BACKENDS["flashinfer"][3]),
    ("flashinfer.cascade.merge_state", _BACKENDS["flashinfer"][3]),
)


def _rerun(probe: str, family: str, target: str, options: Mapping[str, str]) -> str:
    return f"python -m metax_audit.probes run --probe {probe} --family {family} --target {target}" + "".join(f" --option {k}={v}" for k, v in options.items())


def _family_of(target: str) -> str:
    owners = [fam for fam, pairs in _families_by_target().items() if target in pairs]
    if len(owners) == 1:
        return owners[0]
    raise ProbeError(f"target {target!r} needs --family (one of {', '.join(FAMILIES)})")


def _families_by_target() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for pairs in _BACKENDS.values():
        for t, f in pairs:
            out.setdefault(f, set()).add(t)
    out.setdefault("paged-decode", set()).add("torch-sdpa")
    return out


def backend_targets(backend: str) -> list[tuple[str, str]]:
    """(target, family) pairs with built-in adapters for a backend name (flashinfer,
    torch-reference; `FLASHINFER` and `flash-attn` spellings accepted)."""
    key = backend.strip().lower().replace("-", "_")
    key = {"torch_reference": "torch-reference", "flash_attention": "flash_attn", "flash_attn": "flash_attn"}.get(key, key)
    if key in _BACKENDS:
        return list(_BACKENDS[key])
    if key in _NO_ADAPTER:
        raise ProbeError(_NO_ADAPTER[key])
    raise ProbeError(f"no probe targets for backend {backend!r}; known: {', '.join([*_BACKENDS, *_NO_ADAPTER])}")


def targets_from_trace(chain: BackendChain) -> list[tuple[str, str]]:
    """The built-in targets a traced backend really calls (its resolved call sites and chain
    hops), in call order, each once; a chain calling no adapted kernel gives []."""
    names = [c.resolved for c in chain.calls if c.resolved] + [h.resolved or h.qualname for h in chain.chain]
    out: list[tuple[str, str]] = []
    for name in names:
        for suffix, pair in _TRACE_MAP:
            if (suffix in name) and pair not in out:
                out.append(pair)
    return out
