# Shared FlashInfer 0.2.x plumbing for the family adapters: import guard, block table ->
# (indptr, indices, last_page_len), workspace, and controls read from the installed signatures.
from __future__ import annotations

import inspect
from typing import Any, ClassVar

from probes.base import ProbeSkip

WORKSPACE_BYTES = 128 * 1024 * 1024


def import_flashinfer() -> Any:
    try:
        import flashinfer
    except Exception as exc:  # not installed, or its import needs a CUDA toolkit
        raise ProbeSkip(f"flashinfer not importable: {type(exc).__name__}: {exc}") from exc
    return flashinfer


def require_cuda(device: str) -> None:
    if not device.startswith("cuda"):
        raise ProbeSkip(f"FlashInfer targets need a CUDA device (probe ran on {device})")


def paged_metadata(block_table: Any, seq_lens: Any, page_size: int, device: Any) -> tuple[Any, Any, Any]:
    """vLLM's padded block table -> FlashInfer's CSR page list. A request of length 0 gets no
    pages and last_page_len 0; entries past a request's pages (holes, -1) are never read."""
    import torch

    lens = [int(x) for x in seq_lens.tolist()]
    pages = [-(-n // page_size) for n in lens]
    indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
    rows = [block_table[b, : pages[b]].to("cpu", torch.int32) for b in range(len(lens))]
    indices = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.int32)
    last = torch.tensor([n - (p - 1) * page_size if p else 0 for n, p in zip(lens, pages, strict=True)], dtype=torch.int32)
    return indptr.to(device), indices.to(device), last.to(device)


def signature_text(obj: Any, name: str) -> str:
    try:
        return f"{name}{inspect.signature(obj)}"
    except (TypeError, ValueError):
        return f"{name}(<no signature>)"


def accepts(obj: Any, param: str) -> bool:
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return False
    return param in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def prefill_target(spec: str, family: str, fi_obj: Any, wrapper: str, controls: Any) -> Any:
    """The Target of a FlashInfer prefill adapter: its controls are what the installed wrapper's
    plan/run/__init__ accept, so a missing control makes a probe fail closed, not pass."""
    from probes.base import Target, inspect_controls

    w = getattr(fi_obj._fi, wrapper)
    have = {c for c in ("k_scale", "v_scale", "return_lse") if accepts(w.run, c)}
    have |= {c for c in ("sm_scale", "causal") if accepts(w.plan, c)}
    if accepts(w.__init__, "kv_layout"):
        have.add("kv_layout")
    sig, _ = inspect_controls(fi_obj, controls)
    notes = (f"FlashInfer prefill backend: {fi_obj._backend}", f"inspected: {signature_text(w.run, f'{wrapper}.run')}")
    return Target(spec, family, fi_obj, sig, frozenset(have), declares=dict(fi_obj.__probe_declares__), notes=notes)


class FlashInferPrefill:
    """What the paged and ragged prefill adapters share: the FlashInfer import, the device, the
    prefill backend and a wrapper per layout; both return LSE in base 2, [tokens, heads]."""

    __probe_declares__: ClassVar[dict[str, str]] = {"lse": "base-2/[T,H]", "lse_base": "2"}

    def __init__(self, device: str, backend: str = "fa2") -> None:
        self._fi = import_flashinfer()
        self._device = device
        # FA2 code path: the one MetaX's FlashInfer 0.2.6 build derives from (no Hopper FA3 there);
        # `--option fi_backend=auto` probes whatever FlashInfer picks on this GPU instead.
        self._backend = backend
        self._wrappers: dict[str, Any] = {}
