# Adapters for the Triton attention ops of vLLM and of a vendor port (decode attention, merge of
# attention states), loaded file-by-file from a source tree, with minimal documented import shims.
from __future__ import annotations

import logging
import os
import sys
import types
from pathlib import Path
from typing import Any

from metax_audit.probes.base import ProbeContext, ProbeSkip, Target, inspect_controls

# target name -> (which source tree, file inside it, callable)
OPS = {
    "vllm-triton:decode_attention_fwd": ("vllm", "vllm/v1/attention/ops/triton_decode_attention.py", "decode_attention_fwd"),
    "port-triton:decode_attention_fwd": ("port", "vllm_metax/v1/attention/ops/triton_decode_attention.py", "decode_attention_fwd"),
    "vllm-triton:merge_attn_states": ("vllm", "vllm/v1/attention/ops/triton_merge_attn_states.py", "merge_attn_states"),
    "port-triton:merge_attn_states": ("port", "vllm_metax/v1/attention/ops/merge_attn_states.py", "merge_attn_states"),
    # DCP cross-rank reductions (metax_audit/probes/dcp_ranks.py): Triton kernels plus collectives through a group object
    "vllm-triton:cp_lse_ag_out_rs": ("vllm", "vllm/v1/attention/ops/common.py", "cp_lse_ag_out_rs"),
    "vllm-triton:dcp_a2a_lse_reduce": ("vllm", "vllm/v1/attention/ops/dcp_alltoall.py", "dcp_a2a_lse_reduce"),
}
DECODE_TARGETS = tuple(k for k in OPS if k.endswith("decode_attention_fwd"))
MERGE_TARGETS = ("vllm-triton:merge_attn_states", "port-triton:merge_attn_states")
# What each of the port's op files imports from vLLM at call time, provided from the vLLM source tree.
PORT_NEEDS = {"port-triton:merge_attn_states": (("vllm.v1.attention.ops.triton_merge_attn_states", "vllm-triton:merge_attn_states"),)}
SHIMS_DOC = """\
Import shims, installed only when `import vllm.triton_utils` / `vllm.platforms` fails in the probe
process (each probe runs in its own process, so nothing leaks): `vllm.triton_utils` exposes the real
`triton` and `triton.language as tl`; `vllm.distributed.parallel_state.GroupCoordinator` is a bare name (the
DCP reductions only annotate with it); `vllm.platforms.current_platform` answers is_rocm()/is_out_of_tree()
False, is_cuda() True, fp8_dtype() float8_e4m3fn, capability from torch; `vllm.logger.init_logger` is logging.getLogger.
The op's own file is loaded by path: its kernels are the real code under test. The port's files (kind
`port`) also get the MACA launch-option shim (`families/_maca_shim.py`: drops `scenario=...` and the
other MACA-only Triton launch keywords from the port's kernels only, each removal recorded as evidence),
and the vLLM modules they import at call time (`vllm.v1.attention.ops.triton_merge_attn_states`) are the
files of the vLLM source tree. Under the shim `current_platform.is_out_of_tree()` is False, so the port's
`merge_attn_states` dispatcher takes its Triton branch (on MACA it calls `vllm._custom_ops` instead)."""


def _source_root(kind: str, ctx: ProbeContext) -> Path:
    """Where the op's source tree lives: --option vllm_source=DIR / port_source=DIR, the env vars
    METAX_AUDIT_VLLM_SOURCE / METAX_AUDIT_PORT_SOURCE, or an installed package."""
    opt = ctx.options.get(f"{kind}_source") or os.environ.get(f"METAX_AUDIT_{kind.upper()}_SOURCE")
    if opt:
        return Path(opt)
    from importlib.util import find_spec

    pkg = "vllm" if kind == "vllm" else "vllm_metax"
    try:
        spec = find_spec(pkg)
    except Exception:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ProbeSkip(f"no {pkg} source: pass --option {kind}_source=DIR (the directory holding {pkg}/) or set METAX_AUDIT_{kind.upper()}_SOURCE")
    return Path(next(iter(spec.submodule_search_locations))).parent


def _install_shims(notes: list[str]) -> None:
    try:
        import vllm.platforms
        import vllm.triton_utils  # noqa: F401
        return
    except Exception as exc:
        notes.append(f"vllm not importable ({type(exc).__name__}: {str(exc)[:120]}); using import shims")
    import torch
    import triton
    import triton.language as tl

    class _Platform:
        def is_rocm(self) -> bool:
            return False

        def is_out_of_tree(self) -> bool:
            return False

        def is_cuda(self) -> bool:
            return True

        def get_device_capability(self) -> Any:
            return torch.cuda.get_device_capability()

        def fp8_dtype(self) -> Any:
            return torch.float8_e4m3fn

    def mod(name: str, **attrs: Any) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m

    mod("vllm", __path__=[])
    mod("vllm.triton_utils", triton=triton, tl=tl)
    mod("vllm.platforms", current_platform=_Platform())
    mod("vllm.logger", init_logger=logging.getLogger)
    mod("vllm.distributed", __path__=[])
    mod("vllm.distributed.parallel_state", GroupCoordinator=object)  # a type annotation only; metax_audit/probes/dcp_ranks.Group is passed


_LOADED: dict[Path, types.ModuleType] = {}


def _load_file(spec: str, ctx: ProbeContext) -> tuple[types.ModuleType, Path]:
    """Execute one op file by path under a private module name (`_probe_op_<kind>_<stem>`)."""
    from importlib import util as import_util

    kind, rel, _name = OPS[spec]
    path = _source_root(kind, ctx) / rel
    if not path.is_file():
        raise ProbeSkip(f"{spec}: {path} not found")
    if path in _LOADED:  # one worker runs every probe of a target: its kernels are built once
        return _LOADED[path], path
    s = import_util.spec_from_file_location(f"_probe_op_{kind}_{path.stem}", path)
    assert s is not None and s.loader is not None
    module = import_util.module_from_spec(s)
    sys.modules[s.name] = module
    s.loader.exec_module(module)
    _LOADED[path] = module
    return module, path


def _register(name: str, module: types.ModuleType) -> None:
    """Make `import name` give `module`, creating empty parent packages where missing."""
    parts = name.split(".")
    for i in range(1, len(parts)):
        parent = ".".join(parts[:i])
        if parent not in sys.modules:
            sys.modules[parent] = types.ModuleType(parent)
            sys.modules[parent].__path__ = []  # type: ignore[attr-defined]
    sys.modules[name] = module
    setattr(sys.modules[".".join(parts[:-1])], parts[-1], module)


def load_op(spec: str, ctx: ProbeContext) -> tuple[Any, tuple[str, ...]]:
    kind, rel, name = OPS[spec]
    root = _source_root(kind, ctx)
    path = root / rel
    if not path.is_file():
        raise ProbeSkip(f"{spec}: {path} not found")
    notes: list[str] = [f"loaded {name} from {path}", SHIMS_DOC.splitlines()[0]]
    try:
        import triton  # noqa: F401

        _install_shims(notes)
        if kind == "port":
            from metax_audit.probes.families import _maca_shim

            _maca_shim.install()
            notes.append("MACA launch-option shim installed (metax_audit/probes/families/_maca_shim.py): MACA-only launch keywords "
                         "of the port's kernels are removed, and each outcome says which")
            for mod_name, dep in PORT_NEEDS.get(spec, ()):
                if mod_name not in sys.modules:
                    dep_module, _ = _load_file(dep, ctx)
                    _register(mod_name, dep_module)
                notes.append(f"{mod_name} provided from {_source_root(OPS[dep][0], ctx) / OPS[dep][1]}; the port's dispatcher "
                             "takes its Triton branch here (current_platform.is_out_of_tree() is False under the shim; on MACA "
                             "it calls vllm._custom_ops.merge_attn_states)")
        module, _ = _load_file(spec, ctx)
    except ProbeSkip:
        raise
    except Exception as exc:  # the import error is the result: a skip that says why
        raise ProbeSkip(f"{spec}: import failed: {type(exc).__name__}: {str(exc)[:300]}") from exc
    return getattr(module, name), tuple(notes)


class TritonDecode:
    """vLLM-style Triton decode (`decode_attention_fwd(q, k_buffer, v_buffer, o, lse, req_to_token,
    b_seq_len, attn_logits, num_kv_splits, sm_scale, page_size, logit_cap, k_scale, v_scale)`) behind
    the paged-decode convention. The op has no layout switch (its paged buffers are NHD), so
    kv_layout is not offered and the layout probe is not checkable."""

    def __init__(self, fn: Any, num_kv_splits: int = 8) -> None:
        self._fn = fn
        self._splits = num_kv_splits
        self._ones: dict[str, Any] = {}  # unit scales as device tensors, made outside any graph capture

    def __call__(self, q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, *, sm_scale: float,
                 k_scale: Any = None, v_scale: Any = None, return_lse: bool = False) -> Any:
        import torch

        b, h, _d = q.shape
        dv = v_cache.shape[-1]
        o = torch.empty(b, h, dv, dtype=q.dtype, device=q.device)
        lse = torch.empty(b, h, dtype=torch.float32, device=q.device)
        logits = torch.empty(b, h, self._splits, dv + 1, dtype=torch.float32, device=q.device)

        def t(x: Any) -> Any:
            # vLLM passes the layer's scale tensors; the op itself makes host->device copies
            # for None, which a CUDA graph cannot capture, so the adapter passes tensors too
            if isinstance(x, torch.Tensor):
                return x
            if x is None:
                key = str(q.device)
                if key not in self._ones:
                    self._ones[key] = torch.ones((), dtype=torch.float32, device=q.device)
                return self._ones[key]
            return torch.tensor(float(x), dtype=torch.float32, device=q.device)

        self._fn(q, k_cache, v_cache, o, lse, block_table, seq_lens, logits, self._splits, sm_scale, k_cache.shape[1], 0.0,
                 t(k_scale), t(v_scale))
        return (o, lse) if return_lse else o


class TritonMerge:
    """vLLM's `merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse,
    output_lse)` (LSE [heads, tokens], written in place) behind the merge-states convention."""

    def __init__(self, fn: Any) -> None:
        self._fn = fn

    def __call__(self, v_a: Any, s_a: Any, v_b: Any, s_b: Any) -> tuple[Any, Any]:
        import torch

        out = torch.empty_like(v_a)
        out_lse = torch.empty(v_a.shape[1], v_a.shape[0], dtype=torch.float32, device=v_a.device)
        self._fn(out, v_a, s_a.float().T.contiguous(), v_b, s_b.float().T.contiguous(), out_lse)
        return out, out_lse.T


def load_decode(spec: str, ctx: ProbeContext, controls: tuple[str, ...], family: str) -> Target:
    if not ctx.device.startswith("cuda"):
        raise ProbeSkip(f"{spec} is a Triton kernel: needs a CUDA device (probe ran on {ctx.device})")
    fn, notes = load_op(spec, ctx)
    obj = TritonDecode(fn)
    sig, accepted = inspect_controls(obj, controls)
    return Target(spec, family, obj, sig, accepted, notes=(*notes, f"op signature: {spec.split(':')[1]}{_sig(fn)}"))


def load_merge(spec: str, ctx: ProbeContext, family: str) -> Target:
    if not ctx.device.startswith("cuda"):
        raise ProbeSkip(f"{spec} is a Triton kernel: needs a CUDA device (probe ran on {ctx.device})")
    fn, notes = load_op(spec, ctx)
    obj = TritonMerge(fn)
    sig, accepted = inspect_controls(obj, ())
    return Target(spec, family, obj, sig, accepted, notes=(*notes, f"op signature: merge_attn_states{_sig(fn)}"))


def _sig(fn: Any) -> str:
    import inspect

    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(<no signature>)"
