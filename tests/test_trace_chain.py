# The per-backend chain on synthetic ports shaped like the real ones: hops from registration to
# kernel, branches, commented-out arguments, upstream inheritance, findings, robustness, rendering.
from __future__ import annotations

import json
import time

from conftest import write_tree
from rich.console import Console
from test_trace_support import CONFIG, PORT, calls_to, discovery, one_call, port_files, unresolved_texts

from metax_audit.cli.render_trace import chain_to_dict, chain_tree
from metax_audit.core.models import TraceResult
from metax_audit.stages.trace import kernel_entry_points, trace_backends, trace_findings

FI = f"{PORT}/v1/attention/backends/flashinfer.py"
FI_MOD = f"{PORT}.v1.attention.backends.flashinfer"

# A FlashInfer-shaped backend: wrappers made in helper methods, stored on self and on metadata,
# used in forward under prefill/decode/cascade branches, a commented-out plan argument.
FLASHINFER = f'''
from dataclasses import dataclass
from typing import ClassVar

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from vllm.v1.attention.backend import AttentionBackend, AttentionCGSupport, AttentionImpl, AttentionMetadataBuilder
from {PORT}.v1.attention.ops.merge_attn_states import merge_attn_states


class MacaFlashInferBackend(AttentionBackend):
    @staticmethod
    def get_impl_cls():
        return FlashInferImpl

    @staticmethod
    def get_builder_cls():
        return FlashInferMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size):
        return (num_blocks, 2, block_size, num_kv_heads, head_size)


@dataclass
class FIDecode:
    wrapper: BatchDecodeWithPagedKVCacheWrapper


@dataclass
class FlashInferMetadata:
    num_decodes: int
    use_cascade: bool
    decode: FIDecode | None
    prefill_wrapper: BatchPrefillWithPagedKVCacheWrapper | None = None


class FlashInferMetadataBuilder(AttentionMetadataBuilder[FlashInferMetadata]):
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        self._decode_wrapper = None
        self._prefill_wrapper = None

    def _get_decode_wrapper(self):
        if self._decode_wrapper is None:
            self._decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(None, "NHD", use_tensor_cores=True)
        return self._decode_wrapper

    def _get_prefill_wrapper(self):
        if self._prefill_wrapper is None:
            self._prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
        return self._prefill_wrapper

    def build(self, common_prefix_len, common_attn_metadata):
        decode_wrapper = self._get_decode_wrapper()
        decode_wrapper.plan(
            common_attn_metadata.indptr,
            page_size=16,
            # o_data_type=self.model_config.dtype,
            pos_encoding_mode="NONE",
        )
        prefill_wrapper = self._get_prefill_wrapper()
        prefill_wrapper.plan(common_attn_metadata.qo_indptr, causal=True)
        return FlashInferMetadata(1, False, FIDecode(wrapper=decode_wrapper), prefill_wrapper)


class FlashInferImpl(AttentionImpl):
    def __init__(self, num_heads, head_size, scale):
        self.scale = scale

    def forward(self, layer, query, key, value, kv_cache, attn_metadata: FlashInferMetadata, output):
        if attn_metadata.use_cascade:
            raise NotImplementedError("cascade")
        else:
            if attn_metadata.num_decodes > 0:
                decode_wrapper = attn_metadata.decode.wrapper
                decode_wrapper.run(query, kv_cache, k_scale=layer._k_scale_float, v_scale=layer._v_scale_float, out=output)
            elif attn_metadata.prefill_wrapper is not None:
                attn_metadata.prefill_wrapper.run(query, kv_cache, out=output)
            n = output.view(-1).sum().item() if self.scale else 0
        merge_attn_states(output, query, key, value)
        return output.view(-1, 8)
'''

MERGE = '''
import torch


def merge_attn_states(output, prefix_output, prefix_lse, suffix_output):
    from vllm._custom_ops import merge_attn_states as native
    return native(output, prefix_output, prefix_lse, suffix_output)
'''

UPSTREAM = {
    "vllm/__init__.py": "",
    "vllm/v1/__init__.py": "",
    "vllm/v1/attention/__init__.py": "",
    "vllm/_custom_ops.py": "def merge_attn_states(output, prefix_output, prefix_lse, suffix_output):\n    return None\n",
    "vllm/v1/attention/backend.py": '''
import enum


class AttentionCGSupport(enum.Enum):
    ALWAYS = 3
    UNIFORM_SINGLE_TOKEN_DECODE = 1


class AttentionBackend:
    @staticmethod
    def get_kv_cache_stride_order():
        return (0, 1, 2, 3, 4)


class AttentionMetadataBuilder:
    def build_for_cudagraph_capture(self, common_attn_metadata):
        return self.build(common_prefix_len=0, common_attn_metadata=common_attn_metadata)


class AttentionImpl:
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output):
        return self._run_kernel(query)

    def _run_kernel(self, query):
        raise NotImplementedError
''',
}


def _files(extra: dict[str, str] | None = None) -> dict[str, str]:
    files = port_files(
        {
            FI: FLASHINFER,
            f"{PORT}/v1/attention/ops/__init__.py": "",
            f"{PORT}/v1/attention/ops/merge_attn_states.py": MERGE,
        }
    )
    files.update(extra or {})
    return files


def _trace(tmp_path, extra=None, upstream=True, regs=None, active=("FLASHINFER",)) -> TraceResult:
    root = tmp_path / "port"
    write_tree(root, _files(extra))
    up = None
    if upstream:
        up = tmp_path / "upstream"
        write_tree(up, UPSTREAM)
    regs = regs or [("FLASHINFER", f"{FI_MOD}.MacaFlashInferBackend")]
    return trace_backends(discovery(root, regs, active=active), CONFIG, up)


def _chain(result: TraceResult, name: str = "FLASHINFER"):
    return next(ch for ch in result.backends if ch.name == name)


def test_flashinfer_chain_reaches_wrappers_and_kernels(tmp_path):
    result = _trace(tmp_path)
    ch = _chain(result)
    roles = {(h.role, h.resolved) for h in ch.chain}
    assert ("builder", f"{FI_MOD}.FlashInferMetadataBuilder") in roles
    assert ("metadata", f"{FI_MOD}.FlashInferMetadata") in roles
    assert ("impl", f"{FI_MOD}.FlashInferImpl") in roles
    assert ("forward", f"{FI_MOD}.FlashInferImpl.forward") in roles
    assert ("build", f"{FI_MOD}.FlashInferMetadataBuilder.build") in roles
    assert ("kv-cache-shape", f"{FI_MOD}.MacaFlashInferBackend.get_kv_cache_shape") in roles
    wrappers = {h.resolved for h in ch.chain if h.role == "wrapper"}
    assert wrappers == {"flashinfer.BatchDecodeWithPagedKVCacheWrapper", "flashinfer.BatchPrefillWithPagedKVCacheWrapper"}
    kernels = {h.resolved for h in ch.chain if h.role == "kernel"}
    assert {
        "flashinfer.BatchDecodeWithPagedKVCacheWrapper.plan",
        "flashinfer.BatchDecodeWithPagedKVCacheWrapper.run",
        "flashinfer.BatchPrefillWithPagedKVCacheWrapper.plan",
        "flashinfer.BatchPrefillWithPagedKVCacheWrapper.run",
        f"{PORT}.v1.attention.ops.merge_attn_states.merge_attn_states",
        "vllm._custom_ops.merge_attn_states",
    } <= kernels
    layer = {h.qualname for h in ch.chain if h.role == "layer"}
    assert layer == {"layer._k_scale_float", "layer._v_scale_float"}
    assert ch.active
    assert ch.capture_support == "AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE"
    assert ch.unresolved == ()
    assert kernel_entry_points(result)[:2] == ["flashinfer.BatchDecodeWithPagedKVCacheWrapper", "flashinfer.BatchDecodeWithPagedKVCacheWrapper.plan"]
    assert "torch.Tensor.view" not in kernel_entry_points(result)


def test_wrapper_from_metadata_field_annotation_and_lazy_import_into_upstream(tmp_path):
    result = _trace(tmp_path)
    run = one_call(result, "decode_wrapper.run")
    assert run.resolved == "flashinfer.BatchDecodeWithPagedKVCacheWrapper.run"
    assert run.origin == "external"
    native = one_call(result, "native")
    assert (native.resolved, native.origin, native.via) == ("vllm._custom_ops.merge_attn_states", "upstream", "lazy-import")


def test_branch_conditions_outermost_first(tmp_path):
    result = _trace(tmp_path)
    assert one_call(result, "decode_wrapper.run").branch == "not attn_metadata.use_cascade / attn_metadata.num_decodes > 0"
    prefill = one_call(result, "attn_metadata.prefill_wrapper.run")
    assert prefill.branch == "not attn_metadata.use_cascade / not (attn_metadata.num_decodes > 0) / attn_metadata.prefill_wrapper is not None"
    # a ternary guards its arm; a call after the if/else runs only when the branch that raises was not taken
    item = one_call(result, "output.view(-1).sum().item")
    assert item.branch == "not attn_metadata.use_cascade / self.scale"
    assert (item.origin, item.resolved) == ("builtin", "torch.Tensor.item")
    assert one_call(result, "merge_attn_states").branch == "not attn_metadata.use_cascade"


def test_an_early_exit_guards_what_follows_it(tmp_path):
    """`if not use_cascade: ... return` (vllm-metax's FlashAttentionImpl.forward): the calls after it run only with
    cascade on; a branch that does not always leave the function (a nested if without else) guards nothing after it."""
    early = FLASHINFER.replace(
        "        if attn_metadata.use_cascade:\n            raise NotImplementedError(\"cascade\")\n        else:\n",
        "        if not attn_metadata.use_cascade:\n            if self.scale:\n                return output\n"
        "            else:\n                raise ValueError(\"x\")\n        if self.scale > 1:\n            if query is None:\n"
        "                return output\n        if True:\n")
    assert early != FLASHINFER
    result = _trace(tmp_path, {FI: early})
    assert one_call(result, "merge_attn_states").branch == "attn_metadata.use_cascade"
    assert one_call(result, "decode_wrapper.run").branch == "attn_metadata.use_cascade / True / attn_metadata.num_decodes > 0"


def test_commented_out_argument_is_recorded_and_attributed_to_its_call(tmp_path):
    extra = {
        FI: FLASHINFER.replace(
            "prefill_wrapper.plan(common_attn_metadata.qo_indptr, causal=True)",
            "prefill_wrapper.plan(\n            common_attn_metadata.qo_indptr,\n            # a note, not an argument\n            causal=bool(\n                # window_left=-1,\n                1),\n        )",
        )
    }
    result = _trace(tmp_path, extra)
    plan = one_call(result, "decode_wrapper.plan")
    commented = [(a.name, a.text, a.commented_out) for a in plan.args if a.commented_out]
    assert commented == [("o_data_type", "self.model_config.dtype", True)]
    assert [a.name for a in plan.args if not a.commented_out] == [None, "page_size", "pos_encoding_mode"]
    assert plan.args[1].literal == "16"
    # negative: a comment inside a nested call belongs to the nested call; prose is not an argument
    prefill_plan = one_call(result, "prefill_wrapper.plan")
    assert [a.name for a in prefill_plan.args if a.commented_out] == []
    assert [a.name for a in one_call(result, "bool").args if a.commented_out] == ["window_left"]


def test_inherited_methods_follow_into_upstream_and_back_to_port_overrides(tmp_path):
    extra = {
        FI: FLASHINFER.replace("    def forward(self, layer, query, key, value, kv_cache, attn_metadata: FlashInferMetadata, output):", "    def _unused(self, layer, query, key, value, kv_cache, attn_metadata: FlashInferMetadata, output):")
        + "\n    def _run_kernel(self, query):\n        return merge_attn_states(query, query, query, query)\n"
    }
    ch = _chain(_trace(tmp_path, extra))
    fwd = next(h for h in ch.chain if h.role == "forward")
    assert fwd.inherited_from == "upstream:vllm.v1.attention.backend.AttentionImpl"
    assert fwd.path == "vllm/v1/attention/backend.py" and fwd.line > 0
    # upstream forward calls self._run_kernel: the port override is what runs
    run = [c for c in ch.calls if c.callee_text == "self._run_kernel"]
    assert [c.resolved for c in run] == [f"{FI_MOD}.FlashInferImpl._run_kernel"]
    assert any(c.resolved == f"{PORT}.v1.attention.ops.merge_attn_states.merge_attn_states" for c in ch.calls)
    stride = next(h for h in ch.chain if h.role == "kv-stride-order")
    assert stride.inherited_from == "upstream:vllm.v1.attention.backend.AttentionBackend"
    # the builder's capture entry comes from upstream and calls the port's build
    capture_build = [c for c in ch.calls if c.callee_text == "self.build"]
    assert [c.resolved for c in capture_build] == [f"{FI_MOD}.FlashInferMetadataBuilder.build"]


def test_without_upstream_sources_inherited_methods_are_marked_not_guessed(tmp_path):
    extra = {FI: FLASHINFER.replace("    def forward(self, layer, query", "    def _forward_unused(self, layer, query")}
    ch = _chain(_trace(tmp_path, extra, upstream=False))
    fwd = next(h for h in ch.chain if h.role == "forward")
    assert (fwd.path, fwd.resolved, fwd.inherited_from) == ("", "vllm.v1.attention.backend.AttentionImpl.forward", "upstream:vllm.v1.attention.backend.AttentionImpl")
    # negative: a port class named like the upstream base is not an upstream base
    local_base = "class AttentionImpl:\n    pass\n\n\nclass LocalImpl(AttentionImpl):\n    pass\n"
    extra2 = {f"{PORT}/v1/attention/backends/local.py": local_base}
    root = tmp_path / "p2"
    write_tree(root, _files(extra2))
    disc = discovery(root, [("LOCAL", f"{PORT}.v1.attention.backends.local.LocalImpl")])
    # LocalImpl registered as a backend has no get_impl_cls: a registration finding, no upstream hop
    res = trace_backends(disc, CONFIG, None)
    assert all(h.inherited_from is None for h in res.backends[0].chain)
    assert [f.rule for f in trace_findings(res)] == ["MXA050", "MXA052", "MXA053"]


def test_isinstance_narrowing_picks_the_member_of_a_union(tmp_path):
    body = FLASHINFER + '''

class DCPWrapper:
    def run(self, q):
        return merge_attn_states(q, q, q, q)


def dispatch(wrapper: DCPWrapper | BatchPrefillWithPagedKVCacheWrapper, q, use_dcp):
    if use_dcp:
        assert isinstance(wrapper, DCPWrapper)
        wrapper.run(q)
    else:
        wrapper.run(q)
'''
    body = body.replace("        merge_attn_states(output, query, key, value)\n", "        dispatch(None, query, False)\n        merge_attn_states(output, query, key, value)\n")
    result = _trace(tmp_path, {FI: body})
    runs = {(c.location.line, c.resolved) for c in calls_to(result, "wrapper.run")}
    lines = sorted({line for line, _ in runs})
    assert len(lines) == 2
    narrowed = {r for line, r in runs if line == lines[0]}
    union = {r for line, r in runs if line == lines[1]}
    assert narrowed == {f"{FI_MOD}.DCPWrapper.run"}
    assert union == {f"{FI_MOD}.DCPWrapper.run", "flashinfer.BatchPrefillWithPagedKVCacheWrapper.run"}


def test_tensor_plumbing_is_not_unresolved_but_host_syncs_are_kept(tmp_path):
    extra = {FI: FLASHINFER.replace("        return output.view(-1, 8)", "        x = key.contiguous().view(-1)\n        y = value.tolist()\n        return unknown_thing.launch(x, y)")}
    result = _trace(tmp_path, extra)
    texts = unresolved_texts(result)
    assert "key.contiguous().view" not in texts and "key.contiguous" not in texts
    assert one_call(result, "value.tolist").resolved == "torch.Tensor.tolist"
    assert "unknown_thing.launch" in texts and "not defined" in texts["unknown_thing.launch"]


def test_registration_findings_and_activity(tmp_path):
    broken = '''
from vllm.v1.attention.backend import AttentionBackend


class NoImplBackend(AttentionBackend):
    @staticmethod
    def get_builder_cls():
        return None


class NoForwardBackend(AttentionBackend):
    @staticmethod
    def get_impl_cls():
        return NoForwardImpl

    @staticmethod
    def get_builder_cls():
        return Builder


class Builder:
    def build(self, common_prefix_len, common_attn_metadata):
        return None


class NoForwardImpl:
    def __init__(self):
        pass
'''
    regs = [
        ("FLASHINFER", f"{FI_MOD}.MacaFlashInferBackend"),
        ("NOIMPL", f"{PORT}.v1.attention.backends.broken.NoImplBackend"),
        ("NOFWD", f"{PORT}.v1.attention.backends.broken.NoForwardBackend"),
        ("MISSING", f"{PORT}.v1.attention.backends.broken.Missing"),
    ]
    result = _trace(tmp_path, {f"{PORT}/v1/attention/backends/broken.py": broken}, regs=regs, active=("NOFWD",))
    assert [ch.active for ch in result.backends] == [False, False, True, False]
    found = {(f.location.symbol, f.rule) for f in trace_findings(result)}
    assert ("NOIMPL", "MXA050") in found and ("NOIMPL", "MXA052") in found
    assert ("NOFWD", "MXA051") in found and ("NOFWD", "MXA050") not in found
    # a dangling class path is discover's finding; the chain records where it stopped
    assert not any(sym in {"FLASHINFER", "MISSING"} for sym, _ in found)
    missing = _chain(result, "MISSING")
    assert [(h.role, h.resolved) for h in missing.chain] == [("registration", missing.class_path), ("backend", None)]


def test_syntax_error_and_huge_generated_file_do_not_stop_the_run(tmp_path):
    huge = "TABLE = [\n" + "    0,\n" * 900_000 + "]\n\ndef gen_kernel(q):\n    return q\n"
    assert len(huge) > 5_000_000
    extra = {
        f"{PORT}/v1/attention/ops/broken.py": "def oops(:\n    pass\n",
        f"{PORT}/v1/attention/ops/generated.py": huge,
        FI: FLASHINFER.replace(
            "        merge_attn_states(output, query, key, value)\n",
            f"        from {PORT}.v1.attention.ops.broken import oops\n        from {PORT}.v1.attention.ops.generated import gen_kernel\n        oops(query)\n        gen_kernel(query)\n        merge_attn_states(output, query, key, value)\n",
        ),
    }
    start = time.perf_counter()
    result = _trace(tmp_path, extra)
    assert time.perf_counter() - start < 10
    ch = _chain(result)
    assert any(h.role == "kernel" for h in ch.chain)
    reasons = {u.location.path: u.reason for u in result.unresolved}
    assert "syntax error" in reasons[f"{PORT}/v1/attention/ops/broken.py"]
    assert "byte limit" in reasons[f"{PORT}/v1/attention/ops/generated.py"]
    assert {"oops", "gen_kernel"} <= set(unresolved_texts(result))
    rules = {f.rule for f in trace_findings(result)}
    assert "MXA055" in rules


def test_reached_files_and_scope_calls(tmp_path):
    helper = f"{PORT}/utils/kernels.py"
    extra = {
        f"{PORT}/utils/__init__.py": "",
        helper: "from flash_attn import flash_attn_with_kvcache\n\n\ndef run_decode(q):\n    return flash_attn_with_kvcache(q)\n",
        FI: FLASHINFER.replace("        merge_attn_states(output, query, key, value)\n", f"        from {PORT}.utils.kernels import run_decode\n        run_decode(query)\n        merge_attn_states(output, query, key, value)\n"),
    }
    result = _trace(tmp_path, extra)
    assert result.reached_files == (helper,)
    assert any(c.resolved == "flash_attn.flash_attn_with_kvcache" and c.location.path == helper for c in result.calls)
    # scope-wide calls also include functions no chain reaches
    assert any(c.location.path == FI and c.caller.endswith("FlashInferMetadataBuilder._get_prefill_wrapper") for c in result.calls)
    assert len({(c.location, c.resolved) for c in result.calls}) == len(result.calls)


def test_rendering_tree_and_dict(tmp_path):
    ch = _chain(_trace(tmp_path))
    data = chain_to_dict(ch)
    json.dumps(data)
    assert data["registered_at"] == {"path": f"{PORT}/platform.py", "line": 10}
    assert {"role", "qualname", "path", "line", "resolved", "inherited_from"} == set(data["chain"][0])
    plan = next(c for c in data["calls"] if c["callee"] == "decode_wrapper.plan")
    assert {"name": "o_data_type", "position": None, "text": "self.model_config.dtype", "literal": None, "commented_out": True} in plan["args"]
    console = Console(width=200, record=True, color_system=None)
    console.print(chain_tree(ch))
    text = console.export_text()
    assert "FLASHINFER" in text and "flashinfer.BatchDecodeWithPagedKVCacheWrapper.run" in text
    assert "layer._k_scale_float" in text and f"{FI}:" in text


def test_deeply_nested_generated_expression_does_not_crash(tmp_path):
    deep = "def gen(q):\n    return " + " + ".join(["q"] * 3000) + "\n"
    nested = "def nest(q):\n    return " + "f(" * 400 + "q" + ")" * 400 + "\n"
    extra = {
        f"{PORT}/v1/attention/ops/deep.py": deep + nested,
        FI: FLASHINFER.replace(
            "        merge_attn_states(output, query, key, value)\n",
            f"        from {PORT}.v1.attention.ops.deep import gen, nest\n        gen(query)\n        nest(query)\n        merge_attn_states(output, query, key, value)\n",
        ),
    }
    result = _trace(tmp_path, extra)
    assert any(c.resolved == f"{PORT}.v1.attention.ops.merge_attn_states.merge_attn_states" for c in _chain(result).calls)


def test_calling_a_port_object_follows_its_dunder_call(tmp_path):
    body = FLASHINFER + '''

class Combiner:
    def __call__(self, out, lse):
        return merge_attn_states(out, lse, out, lse)


class NotCallable:
    pass
'''
    body = body.replace(
        "        merge_attn_states(output, query, key, value)\n",
        "        combine = Combiner()\n        combine(output, query)\n        broken = NotCallable()\n        broken(output)\n",
    )
    result = _trace(tmp_path, {FI: body})
    assert one_call(result, "combine").resolved == f"{FI_MOD}.Combiner.__call__"
    assert any(c.caller == f"{FI_MOD}.Combiner.__call__" and c.callee_text == "merge_attn_states" for c in _chain(result).calls)
    assert "defines no __call__" in unresolved_texts(result)["broken"]


def test_a_name_upstream_does_not_define_is_unresolved_and_a_defined_one_is_not(tmp_path):
    body = FLASHINFER.replace(
        "from vllm.v1.attention.backend import AttentionBackend,",
        "from vllm._custom_ops import merge_attn_states as native_merge, vanished_op\nfrom vllm.v1.attention.backend import AttentionBackend,",
    ).replace("        merge_attn_states(output, query, key, value)\n", "        native_merge(output, query, key, value)\n        vanished_op(output)\n")
    result = _trace(tmp_path, {FI: body})
    assert one_call(result, "native_merge").resolved == "vllm._custom_ops.merge_attn_states"
    assert unresolved_texts(result)["vanished_op"] == "vanished_op is not defined in upstream vllm._custom_ops"


def test_decorator_only_backend_is_traced_and_duplicates_are_not() -> None:
    from metax_audit.core.models import Location, Registration
    from metax_audit.stages.trace.chain import _backend_registrations

    call = Registration("attention-backend", "FLASHINFER", "p.fi.FiBackend", Location("p/platform.py", 3), True)
    dup = Registration("decorator", "FLASHINFER", "p.fi.FiBackend", Location("p/fi.py", 9), True)
    only = Registration("decorator", "CUSTOM", "p.custom.CustomBackend", Location("p/custom.py", 4), True)
    op = Registration("custom-op", "sparse_indexer", "p.ops.Indexer", Location("p/ops.py", 1), True)
    chosen = _backend_registrations((call, dup, only, op))
    assert [(r.name, r.kind) for r in chosen] == [("FLASHINFER", "attention-backend"), ("CUSTOM", "attention-backend")]
