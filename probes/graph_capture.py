# The `graph-capture` probe: capture the target in a CUDA graph with one set of metadata, change
# inputs and metadata in place (longer sequences, another block table), replay, compare. On CPU it
# runs only as a simulation (option simulate=1), in which host values read at capture stay frozen.
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from probes import _scenario as sc
from probes.base import ProbeContext, ProbeOutcome, ProbeSpec, Target, Tolerance, case_result, conclude

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


def run(target: Target, ctx: ProbeContext) -> ProbeOutcome:
    import torch

    simulate = not ctx.device.startswith("cuda")
    lens_a, lens_b = [20, 33, 7], [45, 12, 60]
    s = sc.build("paged-decode", device=ctx.device, seed=ctx.seed, seq_lens=[64, 64, 64], holes=False)
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
    if two_phase:
        plan(bt, sl, **meta)
        fn = lambda: run_(q, k, v)  # noqa: E731
        mode = "plan outside the graph, run captured; plan again before replay"
    else:
        fn = lambda: target(q, k, v, bt, sl, sm_scale=s.sm_scale)  # noqa: E731
        mode = "whole call captured"

    if simulate:
        with _simulated():
            captured = fn().clone()
        replay = fn
    else:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
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
    if two_phase:
        plan(bt, sl, **meta)
    out = replay().clone()
    hyps = {
        "follows-new-inputs": s.ref(block_table=bt, seq_lens=sl)[0],
        "stale-lengths": s.ref(block_table=bt, seq_lens=torch.tensor(lens_a, dtype=torch.int32))[0],
        "stale-output": captured,
    }
    case = case_result(f"capture lens={lens_a}, replay lens={lens_b} + rolled block table + new q/KV", out, hyps, TOL,
                       tensors={"q": q, "k_cache": k, "block_table": bt, "seq_lens": sl, "out": out})
    details: dict[str, Any] = {"mode": mode, "simulated": simulate}
    try:
        eager, _ = sc.split(target(q, k, v, bt, sl, sm_scale=s.sm_scale))
        details["replay vs eager max |diff|"] = float((eager.float() - out.float()).abs().max())
    except Exception as exc:
        details["eager"] = f"target raised {type(exc).__name__}: {exc}"
    return conclude("graph-capture", target, [case], expected="follows-new-inputs", tol=TOL, details=details)


PROBES = (ProbeSpec(name="graph-capture", families=("paged-decode",), run=run, category="graph-capture", needs_cuda=True,
                    summary="captured in a CUDA graph, replayed after in-place input and metadata changes, the output follows the new inputs"),)
