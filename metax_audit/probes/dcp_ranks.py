# The `dcp` probe across real ranks (option world_size=N): N processes joined by torch.distributed
# (NCCL on GPUs, gloo on CPU; gloo over one GPU's tensors with option backend=gloo), each holding its
# interleaved KV shard, run the producer kernel, then the cross-rank reduction under test with its real
# collectives; every rank's merged heads are compared with full attention on one device.
"""DCP across ranks.

Reduction convention (what every reduction here follows, vLLM's `cp_lse_ag_out_rs` and
`dcp_a2a_lse_reduce` included): `reduce(out [B, H, D], lse [B, H], group) -> out [B, H/N, D]`, the merged
output of this rank's heads `rank*H/N : (rank+1)*H/N`, where `out`/`lse` are the rank's partial attention
over its KV shard and `lse` is in the base the reduction assumes.

Reductions (`--option reduction=SPEC`, default `torch-reference:base-e` on CPU and
`vllm:cp_lse_ag_out_rs` on a GPU, vLLM's default base e):
- `torch-reference:base-e|base-2`: written from the math (all-gather of LSEs, local correction, all-reduce,
  this rank's heads); runs anywhere.
- `vllm:cp_lse_ag_out_rs[:base-2]`, `vllm:dcp_a2a_lse_reduce[:base-2]`: vLLM's own Triton reductions, loaded
  file by file from the vLLM source tree (`vllm_source=DIR` / METAX_AUDIT_VLLM_SOURCE) behind a minimal
  GroupCoordinator over torch.distributed; `:base-2` passes `is_lse_base_on_e=False`.
- `port:flashinfer-dcp-combine`: what the port's FlashInfer backend configures
  (`partial(cp_lse_ag_out_rs, is_lse_base_on_e=False)` in vllm_metax/v1/attention/backends/flashinfer.py).

Hypotheses per case (interleave 1 and 8): `consistent` (full attention), `producer-base-2/reduce-base-e`,
`producer-base-e/reduce-base-2`, `lse-layout-mismatch` (the LSE's [H, B] memory read as [B, H]) and, for
interleave > 1, `interleave-mismatch` (each rank's local lengths computed with interleave 1: `local_lens=SPEC`
names the dcp-local-seq-lens target that computes them, default the reference). NaN/inf where the
hypotheses are finite is `nan-on-empty` (a request has empty ranks at interleave 8).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

from metax_audit.probes.base import (
    CaseResult,
    HypothesisError,
    ProbeContext,
    ProbeOutcome,
    ProbeSkip,
    Target,
    Tolerance,
    case_result,
    conclude,
)

TOL = Tolerance(atol=2e-2, rtol=2e-2)
LENS = (37, 64, 45, 5)
INTERLEAVES = (1, 8)
HQ, HKV, D, PAGE = 4, 2, 128, 16
REFERENCE_REDUCTIONS = ("torch-reference:base-e", "torch-reference:base-2")
VLLM_REDUCTIONS = ("vllm:cp_lse_ag_out_rs", "vllm:cp_lse_ag_out_rs:base-2", "vllm:dcp_a2a_lse_reduce",
                   "vllm:dcp_a2a_lse_reduce:base-2", "port:flashinfer-dcp-combine")
PORT_COMBINE_SITE = "vllm_metax/v1/attention/backends/flashinfer.py"


def owner(t: int, ranks: int, interleave: int) -> int:
    return (t // interleave) % ranks


# ---------------------------------------------------------------- host side: launch and collect


def run_ranks(producer: Target, ctx: ProbeContext) -> ProbeOutcome:
    """Launch `world_size` rank processes on a free port, wait (timeout), collect their cases."""
    import socket

    n = int(ctx.options["world_size"])
    cuda = ctx.device.startswith("cuda")
    backend = ctx.options.get("backend") or ("nccl" if cuda else "gloo")
    default = "vllm:cp_lse_ag_out_rs" if cuda else "torch-reference:base-e"
    reduction = ctx.options.get("reduction", default)
    timeout = float(ctx.options.get("rank_timeout", 240))
    if reduction not in (*REFERENCE_REDUCTIONS, *VLLM_REDUCTIONS):
        raise ProbeSkip(f"unknown reduction {reduction!r}; known: {', '.join((*REFERENCE_REDUCTIONS, *VLLM_REDUCTIONS))}")
    if HQ % n:
        raise ProbeSkip(f"world size {n} does not divide the probe's {HQ} query heads")
    if backend == "nccl":
        import torch

        if torch.cuda.device_count() < n:
            raise ProbeSkip(f"NCCL with {n} ranks needs {n} GPUs; this machine has {torch.cuda.device_count()} "
                            "(one GPU: --option backend=gloo runs the ranks over its tensors)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    job = {"producer": producer.name, "reduction": reduction, "world_size": n, "backend": backend, "port": port,
           "device": ctx.device, "seed": ctx.seed, "options": dict(ctx.options), "timeout": timeout}
    t0 = time.monotonic()
    failed, why, tails, outs = _launch(job, n, timeout)
    seconds = round(time.monotonic() - t0, 2)
    base: dict[str, Any] = {"probe": "dcp", "family": producer.family, "target": producer.name}
    facts = {"world_size": n, "backend": backend, "reduction": reduction, "seconds": seconds}
    if failed is None:
        failed = next((r for r, o in enumerate(outs) if o is None or "error" in o), None)
        if failed is not None:
            why = (outs[failed] or {}).get("error") or f"rank {failed} exited before writing a result"
    if failed is not None:
        if why.startswith("skipped: ") and all(o and o.get("error", "").startswith("skipped: ") for o in outs):
            return ProbeOutcome(**base, verdict="skipped", skipped_reason=why.removeprefix("skipped: "), details=facts)
        return ProbeOutcome(**base, verdict="error", skipped_reason=f"dcp across {n} ranks ({backend}, reduction {reduction}): {why}",
                            evidence=(*(f"rank {r} stderr tail: {t[-600:]}" for r, t in enumerate(tails) if t.strip() or r == failed),
                                      *((outs[failed] or {}).get("traceback", ""),)), details=facts)
    cases = [CaseResult(**{**c, "errors": {h: _error(e) for h, e in c["errors"].items()}}) for c in outs[0]["cases"]]
    agree = all([c["matched"] for c in o["cases"]] == [c.matched for c in cases] for o in outs)
    details = {"world_size": n, "backend": backend, "reduction": reduction, "producer declares": producer.declares.get("lse", "(nothing)"),
               "ranks agree": agree, "per rank matched": {r: [c["matched"] for c in o["cases"]] for r, o in enumerate(outs)},
               "wall seconds (all ranks)": seconds, **outs[0].get("facts", {})}
    evidence = (f"{n} processes, torch.distributed {backend} on 127.0.0.1:{port}; reduction {reduction}: {outs[0].get('reduction_note', '')}",)
    return conclude("dcp", producer, cases, expected="consistent", tol=TOL, details=details, evidence=evidence)


def _launch(job: dict[str, Any], n: int, timeout: float) -> tuple[int | None, str, list[str], list[Any]]:
    """Run the `n` rank processes of `job` in a temp dir until they end or `timeout`: the rank that
    failed first and why (None, "" when none did), each rank's stderr tail and its result (None
    when it wrote none)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="metax-audit-dcp-ranks-") as tmp:
        procs, errs = [], []
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]),
               "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        for r in range(n):
            err = open(os.path.join(tmp, f"rank{r}.err"), "w+", encoding="utf-8", errors="replace")  # noqa: SIM115 (closed below)
            errs.append(err)
            # a rank stands behind the port fence as its parent worker does (metax_audit.core.subproc.fenced)
            fence = ["-S"] if "METAX_AUDIT_NEVER_IMPORT" in os.environ else []
            args = [sys.executable, "-B", *fence, "-m", "metax_audit.probes.dcp_ranks", "--rank", str(r), "--job", json.dumps(job),
                    "--out", os.path.join(tmp, f"rank{r}.json")]
            procs.append(subprocess.Popen(args, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=err, start_new_session=True))
        failed, why = _wait(procs, timeout)
        _kill(procs)
        tails = []
        for e in errs:
            e.seek(0)
            tails.append(e.read()[-1500:])
            e.close()
        outs: list[Any] = []  # a rank's result dict, or None
        for r in range(n):
            path = os.path.join(tmp, f"rank{r}.json")
            if os.path.exists(path):
                with open(path, encoding="utf-8") as fh:
                    outs.append(json.load(fh))
            else:
                outs.append(None)
    return failed, why, tails, outs


def _error(e: dict[str, Any]) -> HypothesisError:
    """A HypothesisError back from a rank's JSON ("inf" strings are floats again)."""
    return HypothesisError(abs=float(e["abs"]), rel=float(e["rel"]), within=bool(e["within"]), shape_ok=bool(e.get("shape_ok", True)))


def _wait(procs: list[Any], timeout: float) -> tuple[int | None, str]:
    """Wait for every rank: (None, "") when all exited 0; else the first rank that failed (non-zero
    exit) or is still running at the timeout, and why. A failed rank leaves the others blocked in a
    collective: the caller kills them all."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        codes = [p.poll() for p in procs]
        for r, c in enumerate(codes):
            if c not in (None, 0):
                return r, f"rank {r} exited with {c}" + (f" (signal {-c})" if c < 0 else "")
        if all(c == 0 for c in codes):
            return None, ""
        time.sleep(0.1)
    running = [r for r, p in enumerate(procs) if p.poll() is None]
    return running[0], (f"rank(s) {', '.join(map(str, running))} still running after {timeout:g}s (hung, or blocked in a "
                        "collective waiting for a hung rank): killed")


def _kill(procs: list[Any]) -> None:
    """Kill every rank's process group (a rank's own children too) and reap them: none is left behind."""
    import contextlib
    import signal

    for p in procs:
        with contextlib.suppress(OSError):
            os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait()


# ---------------------------------------------------------------- rank side


class Group:
    """The part of vLLM's GroupCoordinator the reductions use, over torch.distributed. On gloo,
    reduce-scatter is an all-reduce and a slice (gloo has no reduce_scatter)."""

    def __init__(self, rank: int, world_size: int, backend: str) -> None:
        import torch.distributed as dist

        self.rank_in_group, self.world_size, self._backend = rank, world_size, backend
        self.device_group = dist.group.WORLD

    def all_gather(self, t: Any, dim: int = 0) -> Any:
        import torch
        import torch.distributed as dist

        parts = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts, dim=dim)

    def all_reduce(self, t: Any) -> Any:
        import torch.distributed as dist

        t = t.clone()
        dist.all_reduce(t)
        return t

    def reduce_scatter(self, t: Any, dim: int = 0) -> Any:
        import torch.distributed as dist

        if self._backend == "nccl":  # the real collective, as vLLM's device communicator uses
            chunks = list(t.movedim(dim, 0).contiguous().chunk(self.world_size))
            out = chunks[0].new_empty(chunks[0].shape)
            dist.reduce_scatter(out, [c.contiguous() for c in chunks])
            return out.movedim(0, dim)
        return self.all_reduce(t).chunk(self.world_size, dim=dim)[self.rank_in_group].contiguous()


def torch_reference_reduce(base: str) -> Any:
    """The reduction from the math: weights exp(lse_r - lse_total) (2**... in base 2), rank outputs
    corrected locally, summed across ranks, this rank's heads kept. -inf/NaN LSEs weigh nothing."""

    def reduce(out: Any, lse: Any, group: Group) -> Any:
        import torch

        lses = group.all_gather(lse.float(), dim=0).reshape(group.world_size, *lse.shape)
        lses = torch.where(torch.isfinite(lses), lses, torch.full_like(lses, -math.inf))
        m = lses.max(dim=0).values
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        w = torch.exp(lses - m) if base == "e" else torch.exp2(lses - m)
        total = w.sum(dim=0)
        mine = w[group.rank_in_group] / torch.where(total == 0, torch.ones_like(total), total)
        corrected = torch.where(mine[..., None] == 0, torch.zeros_like(out, dtype=torch.float32), out.float() * mine[..., None])
        summed = group.all_reduce(corrected)
        h = out.shape[1] // group.world_size
        r = group.rank_in_group
        return summed[:, r * h : (r + 1) * h].to(out.dtype)

    return reduce


def load_reduction(spec: str, ctx: ProbeContext) -> tuple[Any, str]:
    """(reduce(out, lse, group) -> this rank's heads, a note saying what ran)."""
    if spec in REFERENCE_REDUCTIONS:
        base = spec.rsplit("-", 1)[1]
        return torch_reference_reduce(base), f"torch reference reduction, LSE base {base}"
    if not ctx.device.startswith("cuda"):
        raise ProbeSkip(f"{spec} is a Triton kernel: needs a CUDA device (ranks ran on {ctx.device})")
    from metax_audit.probes.families import vllm_ops

    name = "cp_lse_ag_out_rs" if "cp_lse_ag_out_rs" in spec or spec.startswith("port:") else "dcp_a2a_lse_reduce"
    base_e = not (spec.endswith(":base-2") or spec.startswith("port:"))
    fn, notes = vllm_ops.load_op(f"vllm-triton:{name}", ctx)
    def reduce(out: Any, lse: Any, group: Group) -> Any:
        return fn(out, lse, group, return_lse=False, is_lse_base_on_e=base_e)

    note = f"vLLM's {name}(is_lse_base_on_e={base_e}); " + "; ".join(notes[:1])
    if spec.startswith("port:"):
        note += f"; as the port configures it: {_port_site(ctx)}"
    return reduce, note


def _port_site(ctx: ProbeContext) -> str:
    """The port's line that configures its DCP combine, read from the port source when given."""
    from metax_audit.probes.families.vllm_ops import _source_root

    try:
        path = _source_root("port", ctx) / PORT_COMBINE_SITE
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "partial(cp_lse_ag_out_rs" in line:
                return f"{PORT_COMBINE_SITE}:{i}: {line.strip()}"
    except Exception as exc:
        return f"{PORT_COMBINE_SITE} not read ({type(exc).__name__})"
    return f"{PORT_COMBINE_SITE}: no partial(cp_lse_ag_out_rs, ...) line found"


def _problem(seed: int, n: int, interleave: int) -> tuple[Any, list[Any], list[Any]]:
    """The same seeded q and full per-request K/V on every rank; keys sharper and values offset by
    owner rank, so partial LSEs and outputs differ enough for a wrong base to show."""
    import torch

    g = torch.Generator().manual_seed(seed + 10 * n + interleave)
    q = torch.randn(len(LENS), HQ, D, generator=g).to(torch.float16)
    ks, vs = [], []
    for L in LENS:
        rank = torch.tensor([owner(t, n, interleave) for t in range(L)], dtype=torch.float32)
        ks.append((torch.randn(L, HKV, D, generator=g) * (1.0 + 1.5 * rank)[:, None, None]).to(torch.float16))
        vs.append((torch.randn(L, HKV, D, generator=g) + 4.0 * rank[:, None, None] - 2.0).to(torch.float16))
    return q, ks, vs


def _local(tokens: Any, length: int) -> Any:
    """A rank's first `length` local tokens: truncated, or zero-extended (a length computed wrongly)."""
    import torch

    if length <= tokens.shape[0]:
        return tokens[:length]
    return torch.cat([tokens, tokens.new_zeros(length - tokens.shape[0], *tokens.shape[1:])])


def _partials(problem: tuple[Any, ...], lengths: list[list[int]]) -> list[tuple[Any, Any]]:
    """fp64 (out, lse_e) of every rank over its shard, each request cut to the given local lengths."""
    import torch

    from metax_audit.probes import reference

    q, ks, vs, shard, scale = problem
    parts = []
    for r in range(len(lengths)):
        res = [reference.attention(q[b : b + 1], _local(ks[b][shard[r][b]], lengths[r][b]), _local(vs[b][shard[r][b]], lengths[r][b]), scale)
               for b in range(len(LENS))]
        parts.append((torch.cat([x[0] for x in res]), torch.cat([x[1] for x in res])))
    return parts


def _merged(parts: list[tuple[Any, Any]], conv: float, base: str, layout_swap: bool = False) -> Any:
    """The reference merge of the partials, their LSEs times `conv` read in `base` (optionally the
    [H, B] memory read as [B, H])."""
    from metax_audit.probes import reference

    def lse_of(p: Any) -> Any:
        s = p * conv
        return s.T.contiguous().reshape(s.shape) if layout_swap else s

    o, s = parts[0][0], lse_of(parts[0][1])
    for po, ps in parts[1:]:
        o, s = reference.merge_states(o, s, po, lse_of(ps), base=base)
    return o


def rank_cases(rank: int, n: int, producer: Target, reduce: Any, group: Group, ctx: ProbeContext, lens_fn: Any) -> list[CaseResult]:
    import torch

    from metax_audit.probes import reference
    from metax_audit.probes._scenario import page_tokens
    from metax_audit.probes.reference import LN2

    scale = 1.0 / math.sqrt(D)
    h = HQ // n
    seq = torch.tensor(LENS, dtype=torch.int32)
    cases = []
    for inter in INTERLEAVES:
        q, ks, vs = _problem(ctx.seed, n, inter)
        full = torch.cat([reference.attention(q[b : b + 1], ks[b], vs[b], scale)[0] for b in range(len(LENS))])
        shard = [[[t for t in range(L) if owner(t, n, inter) == r] for L in LENS] for r in range(n)]
        lens = [lens_fn(seq, dcp_size=n, dcp_rank=r, cp_kv_cache_interleave_size=inter).reshape(-1).tolist() for r in range(n)]
        lens1 = [lens_fn(seq, dcp_size=n, dcp_rank=r, cp_kv_cache_interleave_size=1).reshape(-1).tolist() for r in range(n)]

        problem = (q, ks, vs, shard, scale)
        true_parts = _partials(problem, [[len(x) for x in shard[r]] for r in range(n)])
        declared_base = producer.declares.get("lse_base", "e")
        conv = 1.0 if declared_base == "e" else 1 / LN2  # what the producer hands over, in its base
        hyps = {
            "consistent": full,
            "producer-base-2/reduce-base-e": _merged(true_parts, 1 / LN2, "e"),
            "producer-base-e/reduce-base-2": _merged(true_parts, 1.0, "2"),
            "lse-layout-mismatch": _merged(true_parts, conv, declared_base if declared_base in ("e", "2") else "e", layout_swap=True),
        }
        if inter > 1:
            hyps["interleave-mismatch"] = _merged(_partials(problem, lens1), 1.0, "e")
        # this rank's producer call, over its shard paged through a shuffled block table
        mine_k = [_local(ks[b][shard[rank][b]], lens[rank][b]) for b in range(len(LENS))]
        mine_v = [_local(vs[b][shard[rank][b]], lens[rank][b]) for b in range(len(LENS))]
        kc, bt, sl = page_tokens(mine_k, PAGE, ctx.device)
        vc, _, _ = page_tokens(mine_v, PAGE, ctx.device)
        res = producer(q.to(ctx.device), kc, vc, bt, sl, sm_scale=scale, return_lse=True)
        mine = reduce(res[0], res[1], group)  # this rank's heads
        out = group.all_gather(mine.contiguous(), dim=1)  # every rank's merged heads, in rank order
        empty = any(len({owner(t, n, inter) for t in range(L)}) < n for L in LENS)
        cases.append(case_result(f"ranks={n} interleave={inter} lens={list(LENS)}", out, hyps, TOL,
                                 tensors={"q": q, "merged heads of this rank": mine, "out": out},
                                 note=f"rank {rank} merged heads {rank * h}:{(rank + 1) * h}; all ranks' heads gathered for the comparison",
                                 nonfinite="nan-on-empty" if empty else "non-finite"))
    return cases


def rank_main(argv: list[str] | None = None) -> int:
    """One rank: join the group, run the cases, write {"cases": [...]} (or {"error": ...}) to --out."""
    import datetime
    import traceback
    from dataclasses import asdict

    p = argparse.ArgumentParser(prog="python -m metax_audit.probes.dcp_ranks")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    from metax_audit.stages.introspect_worker.fence import enter_site

    enter_site()  # the port fence first, then site (started with -S when the parent worker was fenced)
    job = json.loads(a.job)
    n, rank = job["world_size"], a.rank
    result: dict[str, Any]
    try:
        import torch
        import torch.distributed as dist

        device = job["device"]
        if device.startswith("cuda"):
            idx = rank % torch.cuda.device_count() if job["backend"] == "nccl" else 0
            torch.cuda.set_device(idx)
            device = f"cuda:{idx}"
        dist.init_process_group(job["backend"], init_method=f"tcp://127.0.0.1:{job['port']}", rank=rank, world_size=n,
                                timeout=datetime.timedelta(seconds=job["timeout"]))
        try:
            from metax_audit.probes.registry import load_target

            ctx = ProbeContext(device=device, seed=job["seed"], options=job["options"])
            producer = load_target(job["producer"], "paged-decode", ctx)
            producer.require("return_lse")
            reduce, note = load_reduction(job["reduction"], ctx)
            lens_fn = load_target(job["options"].get("local_lens", "torch-reference"), "dcp-local-seq-lens", ctx)
            if rank == 0 and os.environ.get("PROBE_TEST_RANK_CRASH") == "1":
                print("rank 0 dying on purpose", file=sys.stderr, flush=True)
                os._exit(9)
            if rank == 1 and os.environ.get("PROBE_TEST_RANK_HANG") == "1":
                time.sleep(3600)
            cases = rank_cases(rank, n, producer, reduce, Group(rank, n, job["backend"]), ctx, lens_fn)
            facts = {"backend": job["backend"], "torch": torch.__version__}
            if device.startswith("cuda"):
                facts.update(gpu=torch.cuda.get_device_name(), nccl=".".join(map(str, torch.cuda.nccl.version())),
                             gpus_visible=torch.cuda.device_count())
            result = {"cases": [asdict(c) for c in cases], "reduction_note": note, "facts": facts}
        finally:
            dist.destroy_process_group()
    except ProbeSkip as exc:
        result = {"error": f"skipped: {exc}"}
    except Exception as exc:
        result = {"error": f"rank {rank} raised {type(exc).__name__}: {str(exc)[:400]}",
                  "traceback": "".join(traceback.format_exc().splitlines(keepends=True)[-6:])}
    from metax_audit.probes.base import _finite

    with open(a.out, "w", encoding="utf-8") as fh:
        json.dump(_finite(result), fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(rank_main())
