# Input builders shared by the probes: a seeded paged (or ragged) attention problem that knows how
# to call a target in its family's convention and how to compute the fp64 reference under overrides.
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from metax_audit.probes import reference
from metax_audit.probes.base import ControlAbsent, Target

PAGED = ("paged-decode", "paged-prefill")
ATTENTION_FAMILIES = ("paged-decode", "paged-prefill", "ragged-prefill")


@dataclass
class Scenario:
    family: str
    q: Any
    k: Any  # paged: k_cache; ragged: k
    v: Any
    seq_lens: Any  # int32 [B] (kv lengths)
    qo_lens: Any | None  # int32 [B]; None for decode
    block_table: Any | None  # paged only
    layout: str
    sm_scale: float
    extra: dict[str, Any] = field(default_factory=dict)

    def tensors(self) -> dict[str, Any]:
        t = {"q": self.q, "k_cache" if self.block_table is not None else "k": self.k,
             "v_cache" if self.block_table is not None else "v": self.v, "seq_lens": self.seq_lens}
        if self.block_table is not None:
            t["block_table"] = self.block_table
        if self.qo_lens is not None:
            t["qo_lens"] = self.qo_lens
        return t

    def call(self, target: Target, **controls: Any) -> Any:
        """Call the target in its family's convention, passing only the controls asked for;
        each must be in the target's accepted controls (else ControlAbsent: fail closed)."""
        target.require(*controls)
        kw: dict[str, Any] = {"sm_scale": self.sm_scale} if "sm_scale" in target.controls else {}
        if self.layout != "NHD" or "kv_layout" in controls:
            target.require("kv_layout")
            kw["kv_layout"] = self.layout
        kw.update(controls)
        if self.family == "paged-decode":
            return target(self.q, self.k, self.v, self.block_table, self.seq_lens, **kw)
        if self.family == "paged-prefill":
            return target(self.q, self.k, self.v, self.block_table, self.seq_lens, self.qo_lens, **kw)
        return target(self.q, self.k, self.v, self.qo_lens, self.seq_lens, **kw)

    def ref(self, *, k: Any = None, v: Any = None, layout: str | None = None, k_scale: float = 1.0,
            v_scale: float = 1.0, block_table: Any = None, seq_lens: Any = None, causal_align: str = "bottom-right",
            causal: bool = True) -> tuple[Any, Any]:
        """(out, lse_e) in fp64 under the given overrides (the hypotheses)."""
        k = self.k if k is None else k
        v = self.v if v is None else v
        layout = layout or self.layout
        bt = self.block_table if block_table is None else block_table
        sl = self.seq_lens if seq_lens is None else seq_lens
        if self.family == "paged-decode":
            return reference.paged_decode(self.q, k, v, bt, sl, sm_scale=self.sm_scale, kv_layout=layout, k_scale=k_scale, v_scale=v_scale)
        if self.family == "paged-prefill":
            return reference.paged_prefill(self.q, k, v, bt, sl, self.qo_lens, sm_scale=self.sm_scale, kv_layout=layout,
                                           causal=causal, k_scale=k_scale, v_scale=v_scale, causal_align=causal_align)
        kf = k.float() * k_scale if k.element_size() == 1 else k * k_scale
        vf = v.float() * v_scale if v.element_size() == 1 else v * v_scale
        return reference.ragged_prefill(self.q, kf, vf, self.qo_lens, sl, sm_scale=self.sm_scale, causal=causal,
                                        kv_layout=layout, causal_align=causal_align)


def split(result: Any) -> tuple[Any, Any | None]:
    """(out, lse) from a target's return; lse None when the target returned only out."""
    if isinstance(result, tuple | list):
        return result[0], (result[1] if len(result) > 1 else None)
    return result, None


def need_lse(target: Target, result: Any) -> tuple[Any, Any]:
    out, lse = split(result)
    if lse is None:
        raise ControlAbsent("return_lse", f"{target.name}{target.signature} (accepted return_lse=True but returned no LSE)")
    return out, lse


def build(family: str, *, device: str, seed: int, seq_lens: list[int], qo_lens: list[int] | None = None,
          hq: int = 4, hkv: int = 2, d: int = 128, page: int = 16, layout: str = "NHD", joint: bool = False,
          dtype: Any = None, kv_dtype: Any = None, spare_blocks: int = 3, holes: bool = True) -> Scenario:
    """A seeded problem. Paged: a shuffled block table over a cache with spare blocks (filled
    with large values so a read outside the table shows), entries past each request's pages set
    to -1 when `holes`. `joint` allocates K and V as views of one [N, 2, ...] tensor."""
    import torch

    dtype = dtype or torch.float16
    g = torch.Generator().manual_seed(seed)
    B = len(seq_lens)
    if family == "paged-decode":
        qo_lens = None
        n_q = B
    else:
        qo_lens = qo_lens if qo_lens is not None else [min(L, 1 + 5 * i) for i, L in enumerate(seq_lens)]
        n_q = sum(qo_lens)
    q = torch.randn(n_q, hq, d, generator=g).to(dtype)
    sl = torch.tensor(seq_lens, dtype=torch.int32)
    ql = None if qo_lens is None else torch.tensor(qo_lens, dtype=torch.int32)
    scale = 1.0 / math.sqrt(d)
    store = kv_dtype or dtype

    if family == "ragged-prefill":
        nnz = sum(seq_lens)
        shape = (nnz, hkv, d) if layout == "NHD" else (hkv, nnz, d)
        if joint:  # K and V as strided views of one packed allocation ([nnz, 2*Hkv, D] or [2*Hkv, nnz, D])
            packed_shape = (nnz, 2 * hkv, d) if layout == "NHD" else (2 * hkv, nnz, d)
            packed = torch.randn(*packed_shape, generator=g).to(store).to(device)
            k, v = (packed[:, :hkv], packed[:, hkv:]) if layout == "NHD" else (packed[:hkv], packed[hkv:])
        else:
            k = torch.randn(*shape, generator=g).to(store).to(device)
            v = torch.randn(*shape, generator=g).to(store).to(device)
        return Scenario(family, q.to(device), k, v, sl.to(device), None if ql is None else ql.to(device), None, layout, scale)

    pages = [-(-L // page) for L in seq_lens]
    width = max(max(pages), 1) + 1
    # at least B * width blocks: a kernel that ignores the block table (reads request b's page j
    # at block b * width + j, the identity mapping) stays in bounds, and reads spare blocks
    n_blocks = max(sum(pages) + spare_blocks, B * width)
    bt, used = shuffled_table(pages, width, n_blocks, g, holes=holes)
    block = (page, hkv, d) if layout == "NHD" else (hkv, page, d)
    if joint:
        both = torch.randn(n_blocks, 2, *block, generator=g)
        spare = [i for i in range(n_blocks) if i not in used]
        both[spare] = 30.0  # a read outside the block table moves the output far
        both = both.to(store).to(device)
        k, v = both[:, 0], both[:, 1]
    else:
        k = torch.randn(n_blocks, *block, generator=g)
        v = torch.randn(n_blocks, *block, generator=g)
        spare = [i for i in range(n_blocks) if i not in used]
        k[spare] = 30.0
        v[spare] = 30.0
        k, v = k.to(store).to(device), v.to(store).to(device)
    return Scenario(family, q.to(device), k, v, sl.to(device), None if ql is None else ql.to(device), bt.to(device), layout, scale)


def page_tokens(tokens: list[Any], page: int, device: str) -> tuple[Any, Any, Any]:
    """Page a list of per-request [L, H, D] tensors into an NHD cache through a shuffled block
    table (no entry at its identity position; B * width blocks, so an identity read stays in
    bounds). A request with no tokens on this rank gets no pages and length 0."""
    import torch

    h, d = tokens[0].shape[1], tokens[0].shape[2]
    pages = [-(-t.shape[0] // page) for t in tokens]
    width = max(max(pages), 1) + 1
    n_blocks = max(sum(pages) + 1, len(tokens) * width)
    bt, _ = shuffled_table(pages, width, n_blocks, torch.Generator().manual_seed(sum(pages) + 7 * width))
    cache = torch.zeros(n_blocks, page, h, d, dtype=tokens[0].dtype)
    for b, t in enumerate(tokens):
        for p in range(pages[b]):
            chunk = t[p * page : (p + 1) * page]
            cache[int(bt[b, p]), : chunk.shape[0]] = chunk
    lens = torch.tensor([t.shape[0] for t in tokens], dtype=torch.int32)
    return cache.to(device), bt.to(device), lens.to(device)


def shuffled_table(pages: list[int], width: int, n_blocks: int, g: Any, *, holes: bool = True) -> tuple[Any, list[int]]:
    """A block table [B, width] whose used entries are a random draw of distinct blocks, none at
    its identity position (b * width + j), so a kernel ignoring the table cannot match by luck.
    Entries past a request's pages are -1 (`holes`) or 0. -> (table, used block ids)."""
    import torch

    B = len(pages)
    for _ in range(100):
        perm = torch.randperm(n_blocks, generator=g)
        bt = torch.full((B, width), -1 if holes else 0, dtype=torch.int32)
        used, pos, clash = [], 0, False
        for b, p in enumerate(pages):
            row = perm[pos : pos + p].to(torch.int32)
            clash |= bool((row == torch.arange(p, dtype=torch.int32) + b * width).any())
            bt[b, :p] = row
            used += row.tolist()
            pos += p
        if not clash:
            return bt, used
    raise AssertionError("no block table without identity entries in 100 draws")  # needs n_blocks <= 1


def identity_table(block_table: Any) -> Any:
    """The block table a kernel that ignores it effectively uses: request b's page j at block b * width + j."""
    import torch

    B, width = block_table.shape
    return torch.arange(B * width, dtype=torch.int32, device=block_table.device).view(B, width)


def other_layout_view(cache: Any, layout: str) -> tuple[Any, str]:
    """How a kernel that reads `layout` memory as the other layout sees it: each block's (or the
    whole ragged tensor's) memory reinterpreted, contiguous strides assumed. -> (tensor, layout)."""
    c = cache.contiguous()
    other = "HND" if layout == "NHD" else "NHD"
    if c.dim() == 4:  # paged: [N, a, b, D] -> [N, b, a, D] by memory
        return c.view(c.shape[0], c.shape[2], c.shape[1], c.shape[3]), other
    return c.view(c.shape[1], c.shape[0], c.shape[2]), other


def ignoring_strides(cache: Any) -> Any:
    """How a kernel that assumes a contiguous cache from its data pointer sees a strided view."""
    import torch

    shape = list(cache.shape)
    stride: list[int] = []
    acc = 1
    for s in reversed(shape):
        stride.insert(0, acc)
        acc *= s
    return torch.as_strided(cache, shape, stride, cache.storage_offset())


def with_seq_lens(s: Scenario, seq_lens: list[int]) -> Scenario:
    import torch

    return replace(s, seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=s.seq_lens.device))
