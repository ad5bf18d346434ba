# The MACA launch-option shim: lets the port's own Triton kernels (written for MetaX's MACA Triton)
# run under stock Triton on an NVIDIA GPU, by removing the launch keywords only MACA's Triton knows.
"""MACA-only Triton launch options, removed so the port's kernels run on stock Triton.

MetaX's Triton accepts launch keywords that stock Triton rejects at launch
(`KeyError: 'Keyword argument scenario was specified but unrecognised'`), e.g. the port's
`triton_decode_attention.py` launches its GQA stage-1 kernel with `scenario="mla"` when
`is_maca_` (always True in the port). `install()` wraps `triton.runtime.jit.JITFunction.run` so
that, for kernels defined in a module whose name starts with `PORT_MODULE_PREFIX` (the port's op
files as `families/vllm_ops.py` loads them) and only for them, each keyword in
`MACA_ONLY_LAUNCH_OPTIONS` is dropped before stock Triton parses the launch, and recorded. Nothing
else changes: the kernel source, its constexprs and the port's own MACA tuning (BLOCK=16,
num_stages=1 under `is_maca_`) run as written. vLLM's kernels are never touched. The runner
attaches `ran with MACA-only launch options removed: scenario='mla' (kernel)` to every outcome
whose probe launched such a kernel, so a verdict never hides that the launch was altered.
"""
from __future__ import annotations

from typing import Any

MACA_ONLY_LAUNCH_OPTIONS = ("scenario",)
PORT_MODULE_PREFIX = "_probe_op_port_"
_REMOVED: dict[str, set[str]] = {}  # "scenario='mla'" -> kernel names, since the last reset()


def strip(module: str, kernel: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """kwargs without the MACA-only options when the kernel is the port's; records what was removed."""
    if not module.startswith(PORT_MODULE_PREFIX):
        return kwargs
    kept = dict(kwargs)
    for key in MACA_ONLY_LAUNCH_OPTIONS:
        if key in kept:
            _REMOVED.setdefault(f"{key}={kept.pop(key)!r}", set()).add(kernel)
    return kept


def install() -> bool:
    """Wrap stock Triton's JITFunction.run once per process; False when Triton is absent."""
    try:
        from triton.runtime import jit
    except Exception:
        return False
    original = jit.JITFunction.run
    if getattr(original, "_maca_shim", False):
        return True

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        fn = getattr(self, "fn", None)
        kwargs = strip(getattr(fn, "__module__", "") or "", getattr(fn, "__name__", "?"), kwargs)
        return original(self, *args, **kwargs)

    run._maca_shim = True  # type: ignore[attr-defined]
    jit.JITFunction.run = run
    return True


def reset() -> None:
    _REMOVED.clear()


def evidence() -> tuple[str, ...]:
    """One line per removed option since the last reset(), naming the kernels it was removed from."""
    return tuple(f"ran with MACA-only launch options removed: {opt} ({', '.join(sorted(k))})" for opt, k in sorted(_REMOVED.items()))
