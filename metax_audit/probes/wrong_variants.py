# Deliberately wrong targets, each a plain callable following a family convention (so they go
# through the MOD:CALLABLE path): the tests prove every probe names each one's wrong hypothesis.
from __future__ import annotations

from typing import Any

from metax_audit.probes import reference

# paged-decode ---------------------------------------------------------------------------------


def _decode(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, sm_scale: float, kv_layout: str,
            k_scale: float, v_scale: float) -> tuple[Any, Any]:
    out, lse = reference.paged_decode(q, k_cache, v_cache, block_table, seq_lens, sm_scale=sm_scale, kv_layout=kv_layout,
                                      k_scale=k_scale, v_scale=v_scale)
    return out.to(q.dtype), lse.float()


def _f(x: Any) -> float:
    return 1.0 if x is None else float(x)


def log2_lse_decode(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, *, sm_scale: float,
                    kv_layout: str = "NHD", k_scale: Any = None, v_scale: Any = None, return_lse: bool = False) -> Any:
    """Returns a base-2 LSE without declaring it (the convention expects base e)."""
    out, lse = _decode(q, k_cache, v_cache, block_table, seq_lens, sm_scale, kv_layout, _f(k_scale), _f(v_scale))
    return (out, lse / reference.LN2) if return_lse else out


def transposed_lse_decode(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, *, sm_scale: float,
                          kv_layout: str = "NHD", k_scale: Any = None, v_scale: Any = None, return_lse: bool = False) -> Any:
    """Returns the LSE as [heads, tokens]."""
    out, lse = _decode(q, k_cache, v_cache, block_table, seq_lens, sm_scale, kv_layout, _f(k_scale), _f(v_scale))
    return (out, lse.T.contiguous()) if return_lse else out


def hnd_read_as_nhd_decode(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, *, sm_scale: float,
                           kv_layout: str = "NHD", k_scale: Any = None, v_scale: Any = None, return_lse: bool = False) -> Any:
    """Accepts kv_layout but always reads the cache memory as NHD."""
    k, v = k_cache, v_cache
    if kv_layout == "HND":
        n, h, p, d = k_cache.shape
        k = k_cache.contiguous().view(n, p, h, d)
        v = v_cache.contiguous().view(n, p, h, d)
    out, lse = _decode(q, k, v, block_table, seq_lens, sm_scale, "NHD", _f(k_scale), _f(v_scale))
    return (out, lse) if return_lse else out


def ignores_strides_decode(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, *, sm_scale: float,
                           kv_layout: str = "NHD", k_scale: Any = None, v_scale: Any = None, return_lse: bool = False) -> Any:
    """Reads the caches as contiguous from their data pointers (wrong for joint [N, 2, ...] views)."""
    from metax_audit.probes._scenario import ignoring_strides

    out, lse = _decode(q, ignoring_strides(k_cache), ignoring_strides(v_cache), block_table, seq_lens, sm_scale, kv_layout,
                       _f(k_scale), _f(v_scale))
    return (out, lse) if return_lse else out


def _scaled(fk: Any, fv: Any, doc: str) -> Any:
    def fn(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, *, sm_scale: float, kv_layout: str = "NHD",
           k_scale: Any = None, v_scale: Any = None, return_lse: bool = False) -> Any:
        ks, vs = fk(_f(k_scale), _f(v_scale)), fv(_f(k_scale), _f(v_scale))
        out, lse = _decode(q, k_cache, v_cache, block_table, seq_lens, sm_scale, kv_layout, ks, vs)
        return (out, lse) if return_lse else out

    fn.__doc__ = doc
    return fn


ignored_scale_decode = _scaled(lambda k, v: 1.0, lambda k, v: 1.0, "Ignores k_scale and v_scale.")
k_scale_ignored_decode = _scaled(lambda k, v: 1.0, lambda k, v: v, "Applies v_scale, ignores k_scale.")
v_scale_ignored_decode = _scaled(lambda k, v: k, lambda k, v: 1.0, "Applies k_scale, ignores v_scale.")
inverted_scale_decode = _scaled(lambda k, v: 1 / k, lambda k, v: 1 / v, "Divides by the scales.")
swapped_scale_decode = _scaled(lambda k, v: v, lambda k, v: k, "Applies v_scale to K and k_scale to V.")
doubled_scale_decode = _scaled(lambda k, v: k * k, lambda k, v: v * v, "Applies each scale twice (caller and kernel).")


def identity_block_table_decode(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, *, sm_scale: float,
                                kv_layout: str = "NHD", k_scale: Any = None, v_scale: Any = None, return_lse: bool = False) -> Any:
    """Ignores the block table: reads request b's page j at block b * width + j."""
    from metax_audit.probes._scenario import identity_table

    out, lse = _decode(q, k_cache, v_cache, identity_table(block_table), seq_lens, sm_scale, kv_layout, _f(k_scale), _f(v_scale))
    return (out, lse) if return_lse else out


def nan_on_empty_decode(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, *, sm_scale: float,
                        kv_layout: str = "NHD", k_scale: Any = None, v_scale: Any = None, return_lse: bool = False) -> Any:
    """Normalises by a zero softmax sum for an empty sequence: NaN out (and NaN LSE) there, and in
    padded (zero-length) rows; real rows are right."""
    out, lse = _decode(q, k_cache, v_cache, block_table, seq_lens, sm_scale, kv_layout, _f(k_scale), _f(v_scale))
    empty = seq_lens.to(out.device) == 0
    out = out.masked_fill(empty[:, None, None], float("nan"))
    lse = lse.masked_fill(empty[:, None], float("nan"))
    return (out, lse) if return_lse else out


def padded_head_decode(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, *, sm_scale: float,
                       kv_layout: str = "NHD", k_scale: Any = None, v_scale: Any = None, return_lse: bool = False) -> Any:
    """Pads query heads to a multiple of 4 internally and returns the padded heads too."""
    import torch

    out, lse = _decode(q, k_cache, v_cache, block_table, seq_lens, sm_scale, kv_layout, _f(k_scale), _f(v_scale))
    pad = (-out.shape[1]) % 4
    if pad:
        out = torch.cat([out, out.new_zeros(out.shape[0], pad, out.shape[2])], dim=1)
        lse = torch.cat([lse, lse.new_zeros(lse.shape[0], pad)], dim=1)
    return (out, lse) if return_lse else out


def compacting_decode(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, *, sm_scale: float,
                      kv_layout: str = "NHD", k_scale: Any = None, v_scale: Any = None, return_lse: bool = False) -> Any:
    """Skips zero-length (padded) requests and packs the real rows first."""
    out, lse = _decode(q, k_cache, v_cache, block_table, seq_lens, sm_scale, kv_layout, _f(k_scale), _f(v_scale))
    real = [b for b, L in enumerate(seq_lens.tolist()) if L > 0]
    packed = out.new_zeros(out.shape)
    packed[: len(real)] = out[real]
    return (packed, lse) if return_lse else packed


class StaleLengthDecode:
    """Two-phase decode whose plan() reads the lengths on the host (allowed: outside capture) and
    whose run() bakes the lengths it saw during a graph capture into the graph, so a replay keeps
    the captured lengths even after plan() is called with new ones (a host int kernel argument)."""

    def __init__(self) -> None:
        self._meta: dict[str, Any] = {}
        self._frozen: list[int] | None = None

    def plan(self, block_table: Any, seq_lens: Any, *, sm_scale: float, kv_layout: str = "NHD", **_: Any) -> None:
        self._meta = {"block_table": block_table, "lens": seq_lens.tolist(), "sm_scale": sm_scale, "kv_layout": kv_layout}

    def run(self, q: Any, k_cache: Any, v_cache: Any, *, k_scale: Any = None, v_scale: Any = None, return_lse: bool = False) -> Any:
        import torch

        from metax_audit.probes.graph_capture import capturing

        m = self._meta
        lens = self._frozen if self._frozen is not None else m["lens"]
        if capturing():
            self._frozen = list(lens)
        out, lse = _decode(q, k_cache, v_cache, m["block_table"], torch.tensor(lens, dtype=torch.int32), m["sm_scale"], m["kv_layout"],
                           _f(k_scale), _f(v_scale))
        return (out, lse) if return_lse else out

    def __call__(self, q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, *, sm_scale: float,
                 kv_layout: str = "NHD", k_scale: Any = None, v_scale: Any = None, return_lse: bool = False) -> Any:
        self.plan(block_table, seq_lens, sm_scale=sm_scale, kv_layout=kv_layout)
        self._frozen = None  # an eager call is never stale
        return self.run(q, k_cache, v_cache, k_scale=k_scale, v_scale=v_scale, return_lse=return_lse)


class HostSyncDecode:
    """Two-phase decode that is right eagerly but reads each sequence length on the host in run()
    (`int(seq_lens[b])`): inside a CUDA graph capture that is a device-to-host sync."""

    def __init__(self) -> None:
        self._meta: dict[str, Any] = {}

    def plan(self, block_table: Any, seq_lens: Any, *, sm_scale: float, kv_layout: str = "NHD", **_: Any) -> None:
        self._meta = {"block_table": block_table, "seq_lens": seq_lens, "sm_scale": sm_scale, "kv_layout": kv_layout}

    def run(self, q: Any, k_cache: Any, v_cache: Any, *, k_scale: Any = None, v_scale: Any = None, return_lse: bool = False) -> Any:
        import torch

        m = self._meta
        lens = [int(m["seq_lens"][b]) for b in range(q.shape[0])]  # the host sync under test
        out, lse = _decode(q, k_cache, v_cache, m["block_table"], torch.tensor(lens, dtype=torch.int32), m["sm_scale"], m["kv_layout"],
                           _f(k_scale), _f(v_scale))
        return (out, lse) if return_lse else out

    def __call__(self, q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, *, sm_scale: float,
                 kv_layout: str = "NHD", k_scale: Any = None, v_scale: Any = None, return_lse: bool = False) -> Any:
        self.plan(block_table, seq_lens, sm_scale=sm_scale, kv_layout=kv_layout)
        return self.run(q, k_cache, v_cache, k_scale=k_scale, v_scale=v_scale, return_lse=return_lse)


def host_sync_plain_decode(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, *, sm_scale: float,
                           kv_layout: str = "NHD", k_scale: Any = None, v_scale: Any = None, return_lse: bool = False) -> Any:
    """A plain callable (no plan/run) that reads lengths on the host: on CPU graph capture is not checkable for it."""
    lens = [int(x) for x in seq_lens]
    import torch

    out, lse = _decode(q, k_cache, v_cache, block_table, torch.tensor(lens, dtype=torch.int32), sm_scale, kv_layout, _f(k_scale), _f(v_scale))
    return (out, lse) if return_lse else out


def h2d_scale_decode(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, *, sm_scale: float,
                     kv_layout: str = "NHD", k_scale: Any = None, v_scale: Any = None, return_lse: bool = False) -> Any:
    """Makes its unit scale with torch.tensor(1.0, device=...) inside the call, as vLLM's Triton decode
    does for k_scale=None: a pageable host-to-device copy, which a CUDA graph capture cannot hold."""
    import torch

    one = torch.tensor(1.0, dtype=torch.float32, device=q.device)  # the host sync under test (on a GPU)
    out, lse = _decode(q, k_cache, v_cache, block_table, seq_lens, sm_scale, kv_layout, float(one.cpu()), _f(v_scale))
    return (out, lse) if return_lse else out


# ragged-prefill -------------------------------------------------------------------------------


def top_left_causal_ragged(q: Any, k: Any, v: Any, qo_lens: Any, kv_lens: Any, *, sm_scale: float, causal: bool = True,
                           kv_layout: str = "NHD", return_lse: bool = False) -> Any:
    """Aligns the causal mask to the first key instead of the last (wrong when kv_len > qo_len)."""
    out, lse = reference.ragged_prefill(q, k, v, qo_lens, kv_lens, sm_scale=sm_scale, causal=causal, kv_layout=kv_layout,
                                        causal_align="top-left")
    out = out.to(q.dtype)
    return (out, lse.float()) if return_lse else out


# merge-states and dcp-local-seq-lens ----------------------------------------------------------


def merge_assumes_base2(v_a: Any, s_a: Any, v_b: Any, s_b: Any) -> tuple[Any, Any]:
    """Merges as if the LSEs were base 2, without declaring it (the convention expects base e)."""
    v, s = reference.merge_states(v_a, s_a, v_b, s_b, base="2")
    return v.to(v_a.dtype), s.float()


def dropped_interleave_offset_local_lens(seq_lens: Any, dcp_size: int = 1, dcp_rank: int | None = None,
                                         cp_kv_cache_interleave_size: int = 1) -> Any:
    """Offsets each rank by `rank` tokens instead of `rank * interleave` tokens."""
    import torch

    i, n = cp_kv_cache_interleave_size, dcp_size
    sl = seq_lens.to(torch.int32)
    ranks = torch.arange(n, dtype=torch.int32) if dcp_rank is None else torch.tensor([dcp_rank], dtype=torch.int32)
    base = (sl // (i * n) * i)[:, None]
    rem = sl[:, None] - base * n
    out = base + torch.clamp(rem - ranks[None, :], 0, i)
    return out if dcp_rank is None else out[:, 0]


# worker robustness -----------------------------------------------------------------------------


def misbehaving_decode(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, *, sm_scale: float,
                       kv_layout: str = "NHD", k_scale: Any = None, v_scale: Any = None, return_lse: bool = False) -> Any:
    """Right, except that it hangs when given FP8 scales and kills its process (exit 7, after a line
    on stderr) when asked for 6 query heads: the probe worker must record both and carry on. Writes
    its pid to $PROBE_TEST_PIDFILE so a test can check that no process is left behind."""
    import os
    import sys
    import time

    if os.environ.get("PROBE_TEST_PIDFILE"):
        with open(os.environ["PROBE_TEST_PIDFILE"], "a", encoding="utf-8") as fh:
            fh.write(f"{os.getpid()}\n")
    if k_scale is not None:
        time.sleep(3600)
    if q.shape[1] == 6:
        print("misbehaving_decode: dying on purpose", file=sys.stderr, flush=True)
        os._exit(7)
    out, lse = _decode(q, k_cache, v_cache, block_table, seq_lens, sm_scale, kv_layout, _f(k_scale), _f(v_scale))
    return (out, lse) if return_lse else out


def interleave_ignored_local_lens(seq_lens: Any, dcp_size: int = 1, dcp_rank: int | None = None,
                                  cp_kv_cache_interleave_size: int = 1) -> Any:
    """Per-rank KV lengths computed as if tokens were dealt one by one (interleave 1), whatever the
    interleave size the cache was sharded with."""
    from metax_audit.probes.families.merge_states import reference_local_seq_lens

    return reference_local_seq_lens(seq_lens, dcp_size, dcp_rank, 1)
