# Shared FlashInfer 0.2.x plumbing for the family adapters: import guard, block table ->
# (indptr, indices, last_page_len), workspace, and controls read from the installed signatures.
from __future__ import annotations

import inspect
from typing import Any, ClassVar

from metax_audit.probes.base import ProbeSkip

WORKSPACE_BYTES = 128 * 1024 * 1024


def import_flashinfer() -> Any:
    try:
        import flashinfer
    except Exception as exc:  # not installed, or its import needs a CUDA toolkit
        raise ProbeSkip(f"flashinfer not importable: {type(exc).__name__}: {exc}") from exc
    _serialise_jit_builds()
    return flashinfer


def _serialise_jit_builds() -> None:
    """FlashInfer 0.2.x runs every JIT module's ninja in one shared directory (cached_ops, one
    .ninja_log/.ninja_deps) under a lock per module only. Probe workers of several targets run side
    by side, and two ninjas writing those files at once lose the build records: the next process
    rebuilds every module (seen on the H200: a warm run as slow as a cold one). One lock around
    every ninja run of this process, shared with the other workers through the file system, keeps
    the records whole. A FlashInfer without `jit.core.run_ninja` is left as it is."""
    try:
        from filelock import FileLock
        from flashinfer.jit import core
        from flashinfer.jit import env as jit_env
    except Exception:
        return
    original = getattr(core, "run_ninja", None)
    if original is None or getattr(original, "_probe_lock", False):
        return
    lock_path = jit_env.FLASHINFER_JIT_DIR / "metax-audit-probe-ninja.lock"

    def run_ninja(*args: Any, **kwargs: Any) -> Any:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(lock_path), thread_local=False):
            return original(*args, **kwargs)

    run_ninja._probe_lock = True  # type: ignore[attr-defined]
    core.run_ninja = run_ninja


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
    from metax_audit.probes.base import Target, inspect_controls

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
