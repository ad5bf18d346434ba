# The `graph-capture` probe: capture the target in a CUDA graph with one set of metadata, change
# inputs and metadata in place (longer sequences, another block table), replay, compare. A host
# read of device memory during the captured call is named `not-capturable: host sync at FILE:LINE`.
# On CPU it runs only as a simulation (option simulate=1) of two-phase (plan/run) targets, in which
# host values read at capture stay frozen and host reads of the inputs during run are caught.
from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from metax_audit.probes import _scenario as sc
from metax_audit.probes.base import (
    CaseResult,
    NotCheckable,
    ProbeContext,
    ProbeOutcome,
    ProbeSpec,
    Target,
    Tolerance,
    case_result,
    conclude,
)

TOL = Tolerance(atol=1e-2, rtol=1e-2)
_SIMULATED_CAPTURE = [False]


def capturing() -> bool:
    """True while a (real or simulated) graph capture is recording: a target that reads host
    values now has them baked into the graph."""
    if _SIMULATED_CAPTURE[0]:
        return True
    try:
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    except Exception:
        return False


@contextlib.contextmanager
def _simulated() -> Iterator[None]:
    _SIMULATED_CAPTURE[0] = True
    try:
        yield
    finally:
        _SIMULATED_CAPTURE[0] = False


# Tensor methods that read device memory on the host: each one inside a captured call either
# fails the capture (a sync) or bakes a value into the graph.
HOST_READS = frozenset({"item", "tolist", "__int__", "__float__", "__bool__", "__index__", "numpy", "cpu"})


class HostSync(Exception):
    """A host read of device memory inside the call that would be captured."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(f"{what} at {where}")
        self.where = where
        self.what = what


def _where(frames: Sequence[traceback.FrameSummary]) -> str:
    """The innermost frame outside torch and this file: the line of the target that read."""
    here = os.path.abspath(__file__)
    for f in reversed(frames):
        path = os.path.abspath(f.filename)
        if path == here or f"{os.sep}torch{os.sep}" in path or path.endswith(f"{os.sep}contextlib.py"):
            continue
        return f"{_short(path)}:{f.lineno}"
    return "<unknown>"


def _short(path: str) -> str:
    """The path as imported (relative to its sys.path entry or the cwd), else absolute."""
    import sys

    roots = [os.path.abspath(p) for p in sys.path if p] + [os.getcwd()]
    rels = [os.path.relpath(path, r) for r in roots if path.startswith(r.rstrip(os.sep) + os.sep)]
    return min(rels, key=len) if rels else path


def _watch(tensors: Sequence[Any]) -> Any:
    """A torch function mode that raises HostSync when a host read touches the storage of one of
    `tensors` (the call's inputs and metadata, views of them included)."""
    import torch
    from torch.overrides import TorchFunctionMode

    ptrs = {t.untyped_storage().data_ptr() for t in tensors}

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            name = getattr(func, "__name__", "")
            if name in HOST_READS and args and isinstance(args[0], torch.Tensor) and args[0].untyped_storage().data_ptr() in ptrs:
                raise HostSync(_where(traceback.extract_stack()), f"Tensor.{name}()")
            return func(*args, **(kwargs or {}))

    return Watch()


def _check_host_sync(fn: Callable[[], Any], tensors: Sequence[Any], cuda: bool) -> None:
    """Call fn once as it will be captured: host reads of the inputs (torch function mode) and,
    on a GPU, any synchronising CUDA call (torch's sync debug mode set to error) raise HostSync."""
    import torch

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        with _watch(tensors):
            fn()
    except RuntimeError as exc:
        if cuda and "synchroniz" in str(exc):
            raise HostSync(_where(traceback.extract_tb(exc.__traceback__)), "synchronizing CUDA call: " + str(exc).splitlines()[0][:160]) from exc
        raise
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode(0)


def _not_capturable(target: Target, exc: HostSync, details: dict[str, Any]) -> ProbeOutcome:
    name = f"not-capturable: host sync at {exc.where}"
    case = CaseResult(name="host reads during the captured call", matched=name, errors={}, note=str(exc))
    return conclude("graph-capture", target, [case], expected="follows-new-inputs", tol=TOL,
                    details={**details, "host sync": str(exc)}, evidence=(f"host sync: {exc}",))


def run(target: Target, ctx: ProbeContext) -> ProbeOutcome:
    import torch

    simulate = not ctx.device.startswith("cuda")
    lens_a, lens_b = [20, 33, 7], [45, 12, 60]
    s = sc.build("paged-decode", device=ctx.device, seed=ctx.seed, seq_lens=[64, 64, 64], holes=False)
    assert s.block_table is not None  # a paged-decode scenario
    q, k, v, bt, sl = s.q, s.k, s.v, s.block_table.clone(), torch.tensor(lens_a, dtype=torch.int32, device=ctx.device)
    bt_b = bt.roll(1, dims=0)  # each request now reads another request's pages
    g = torch.Generator().manual_seed(ctx.seed + 7)
    q2, k2, v2 = (torch.randn(x.shape, generator=g).to(x.dtype).to(ctx.device) for x in (q, k, v))

    graph_obj = target.fn.for_cuda_graph(len(lens_a), int(bt.numel())) if hasattr(target.fn, "for_cuda_graph") else None
    plan = getattr(graph_obj, "plan", None) or target.plan
    run_ = getattr(graph_obj, "run", None) or target.run
    meta = dict(sm_scale=s.sm_scale, kv_layout="NHD", num_qo_heads=q.shape[1], num_kv_heads=k.shape[2], head_dim=q.shape[2],
                page_size=k.shape[1], q_dtype=q.dtype, kv_dtype=k.dtype)
    two_phase = plan is not None and run_ is not None
    if simulate and not two_phase:
        raise NotCheckable("plain callable on CPU: the graph-capture simulation needs plan/run phases (a host read inside one "
                           "eager call cannot be told from graph-safe code without a CUDA device)")
    if plan is not None and run_ is not None:  # two_phase
        plan(bt, sl, **meta)
        fn = lambda: run_(q, k, v)  # noqa: E731
        mode = "plan outside the graph, run captured; plan again before replay"
    else:
        fn = lambda: target(q, k, v, bt, sl, sm_scale=s.sm_scale)  # noqa: E731
        mode = "whole call captured"

    details: dict[str, Any] = {"mode": mode, "simulated": simulate}
    watched = (q, k, v, bt, sl)
    if simulate:
        try:
            with _simulated(), _watch(watched):
                captured = fn().clone()
        except HostSync as exc:
            return _not_capturable(target, exc, details)
        replay = fn
    else:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()  # warm-up: JIT builds and lazy initialisation happen outside the checks
            try:
                _check_host_sync(fn, watched, cuda=True)
            except HostSync as exc:
                torch.cuda.current_stream().wait_stream(side)
                return _not_capturable(target, exc, details)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = fn()
        graph.replay()
        torch.cuda.synchronize()
        captured = static_out.clone()

        def replay() -> Any:
            graph.replay()
            torch.cuda.synchronize()
            return static_out

    q.copy_(q2)
    k.copy_(k2)
    v.copy_(v2)
    bt.copy_(bt_b)
    sl.copy_(torch.tensor(lens_b, dtype=torch.int32))
    if plan is not None and two_phase:
        plan(bt, sl, **meta)
    out = replay().clone()
    hyps = {
        "follows-new-inputs": s.ref(block_table=bt, seq_lens=sl)[0],
        "stale-lengths": s.ref(block_table=bt, seq_lens=torch.tensor(lens_a, dtype=torch.int32))[0],
        "stale-output": captured,
    }
    case = case_result(f"capture lens={lens_a}, replay lens={lens_b} + rolled block table + new q/KV", out, hyps, TOL,
                       tensors={"q": q, "k_cache": k, "block_table": bt, "seq_lens": sl, "out": out})
    try:
        eager, _ = sc.split(target(q, k, v, bt, sl, sm_scale=s.sm_scale))
        details["replay vs eager max |diff|"] = float((eager.float() - out.float()).abs().max())
    except Exception as exc:
        details["eager"] = f"target raised {type(exc).__name__}: {exc}"
    return conclude("graph-capture", target, [case], expected="follows-new-inputs", tol=TOL, details=details)


PROBES = (ProbeSpec(name="graph-capture", families=("paged-decode",), run=run, category="graph-capture", needs_cuda=True,
                    summary="captured in a CUDA graph, replayed after in-place input and metadata changes, the output follows the new inputs"),)
