# What makes each rule an error, a warning or info, with an example of each: the severity model of
# DESIGN.md applied per rule (error = breaks on the target stack; warning = can change what a kernel
# computes or whether it runs, unexplained; info = explained or harmless). docs/rules.md renders it.
from __future__ import annotations

E, W, I = "error", "warning", "info"  # noqa: E741 - the three severities, as the docs write them

_PROBES = {"400": "lse", "401": "layout", "402": "fp8-scale", "403": "dcp", "404": "query-count", "405": "padding",
           "406": "graph-capture"}
_PROBE_EXAMPLES = {
    "lse": "the paged-decode target returns base-2 LSE where the contract says base e",
    "layout": "the target reads the KV cache as NHD where the backend allocates HND",
    "fp8-scale": "the target ignores k_scale/v_scale (matches the 'ignored' hypothesis)",
    "dcp": "partial outputs merged over KV shards differ from full attention",
    "query-count": "rows of padded queries come back as real tokens",
    "padding": "zero-length requests produce NaN rows",
    "graph-capture": "replay after changing the inputs in place returns the captured inputs' output",
}

SEVERITY: dict[str, tuple[tuple[str, str, str], ...]] = {
    "MXA001": ((E, "a file in scope does not parse, so nothing in it was traced or compared",
                "`vllm_metax/v1/attention/backends/flashinfer.py`: SyntaxError at line 120"),),
    "MXA002": ((I, "a stage skipped the file for a stated reason (size limit, generated code)",
                "`ops/generated_tables.py` is 3.1 MB (limit 2 MB): not analysed"),),
    "MXA003": ((W, "the test command given with --test exited non-zero on the snapshot",
                "`pytest tests/attn` exited 1: 1 failed"),),
    "MXA010": ((E, "a registration's class path names no class in the snapshot: the backend cannot be loaded",
                "`register_backend(FLASHINFER, class_path=\"...flashinfer.MacaFlashInferBackendX\")`"),),
    "MXA011": ((I, "a backend is registered but no priority list names it: it runs only when selected explicitly",
                "CUSTOM registered in triton_attn.py, in no priority list"),),
    "MXA012": ((W, "a priority list names a backend the port does not register: the upstream (NVIDIA) class is loaded",
                "priorities (else): FLASHINFER, FLEX_ATTENTION, with FLEX_ATTENTION not registered"),),
    "MXA013": ((W, "one backend is registered twice with different class paths: which one runs depends on import order",
                "FLASH_ATTN -> ...flash_attn.MacaFlashAttentionBackend and ...mla.prefill.flash_attn.MacaFlashAttnPrefillBackend"),),
    "MXA014": ((I, "a registration points outside the audited snapshot (another package); it is not audited here",
                "class_path=\"vllm.v1.attention.backends.flex_attention.FlexAttentionBackend\""),),
    "MXA015": ((I, "the platform switches a feature off; branches behind it are inactive on this platform",
                "`model_config.disable_cascade_attn = True` in check_and_update_config"),),
    "MXA016": ((W, "a registration's backend or class path is computed, so the audit cannot follow it",
                "`register_backend(name, class_path=prefix + name)`"),),
    "MXA017": ((W, "a decorator registration passes a string that is not a class path: the decorated class is not registered and "
                   "selecting the member imports the string",
                "`@register_backend(AttentionBackendEnum.CUSTOM, \"maca_custom\")` on a class"),
               (I, "the platform selects its backends by returning class paths, so the registry entry is unused",
                "`get_attn_backend_cls` returns `\"vllm_ascend.attention.AscendBackend\"` directly")),
    "MXA050": ((E, "the registered backend's get_impl_cls leads to no class: the backend cannot run",
                "`get_impl_cls()` returns a name that is not defined or imported"),),
    "MXA051": ((E, "the implementation class has no forward: the backend cannot run",
                "`MacaTritonAttentionImpl` defines do_kv_cache_update but no forward"),),
    "MXA052": ((W, "a registered backend has no metadata builder: its metadata comes from somewhere the audit cannot see",
                "`get_builder_cls` missing on MacaFlexAttentionBackend"),),
    "MXA053": ((W, "the traced chain reaches no kernel: the backend's computation was not audited",
                "FLASH_ATTN chain ends at forward with 0 kernel calls resolved"),),
    "MXA054": ((I, "a call in a backend chain could not be resolved statically; it is listed so coverage is honest",
                "`self._decode_wrapper.run(...)` where the wrapper is built by a factory"),),
    "MXA055": ((W, "a file the trace reached could not be read, so its calls were not audited",
                "`vllm_metax/ops/x.py`: permission denied"),),
    "MXA101": ((E, "a call passes a keyword the installed kernel does not accept: TypeError on that path",
                "`BatchDecodeWithPagedKVCacheWrapper(..., backend=...)` with flashinfer 0.2.6 (no `backend` parameter)"),),
    "MXA113": ((I, "a call passes a keyword that the public base of a package config's vendor-extends names lacks: the "
                   "private vendor build may take it, so the call is unchecked, counted in every headline's INCOMPLETE line "
                   "with the way out (a --stack manifest from `evidence --capture-stack` binds it)",
                "`flash_attn_varlen_func(..., s_aux=...)` against the public flash_attn 2.6.3 of the pinned vendor build"),),
    "MXA102": ((E, "a call passes more positionals than the installed kernel takes",
                "`flash_mla_with_kvcache(q, k, bt, sl, dv, md, ns, scale)` where the installed kernel takes 7"),),
    "MXA103": ((E, "a call omits a required parameter of the installed kernel",
                "`merge_attn_states(out, p_out, p_lse, s_out)` without the required `suffix_lse`"),),
    "MXA104": ((E, "a call binds an argument twice or passes a positional-only parameter by keyword",
                "`kernel(q, q=q2)`"),),
    "MXA105": ((E, "the port passes more positionals than upstream's call: it follows an older signature and every later value shifts",
                "`ops.cp_gather_and_upconvert_fp8_kv_cache(..., chunk.seq_lens, ...)`: `workspace_starts` lands on `batch_size`"),
               (W, "a positional lands on another installed parameter than upstream's call passes it to, without extra positionals",
                "the port passes `block_table` second where upstream passes it third"),
               (I, "the installed wrapper only forwards its arguments by position to a torch op the port registers itself, "
                   "whose schema takes the values where the port passes them: they land right on the vendor stack",
                "`ops.cp_gather_and_upconvert_fp8_kv_cache(..., chunk.seq_lens, chunk.workspace_starts, n)`: the port's "
                "csrc keeps `(..., seq_lens, workspace_starts, batch_size)`")),
    "MXA106": ((I, "the installed kernel could not be inspected (import error, no signature), so the call was not checked",
                "`flash_mla.get_mla_metadata`: import error on this machine; 5 calls not checked"),),
    "MXA107": ((E, "a call passes a keyword the port's or upstream's own callee does not accept: TypeError when it runs",
                "`self._init_reorder_batch_threshold(1, supports_dcp_with_varlen=True)` against a port method without that parameter"),),
    "MXA108": ((E, "a call passes more positionals than the port's or upstream's callee takes: TypeError",
                "`get_mla_dims(model_config, 3)` where get_mla_dims takes one parameter"),),
    "MXA109": ((E, "a call omits a required parameter of the port's or upstream's callee, or binds one twice: TypeError",
                "`fast_plan_decode(wrapper, indptr_cpu=...)` without the required `seq_lens_cpu`"),),
    "MXA110": ((W, "a keyword lands in the kernel's **kwargs and the kernel never reads it: the argument is silently ignored",
                "`run(q, kv, window=4, o_dtype=n)` where run(q, kv, *, window=-1, **kwargs) never reads `o_dtype`"),),
    "MXA111": ((I, "a keyword lands in **kwargs and is forwarded to another callable (checked there)",
                "`plan(..., **kwargs)` forwards `kv_data_type` to the module's plan"),),
    "MXA112": ((E, "a call of a compiled-module function (JIT or extension module, no Python signature) passes an arity or "
                   "keywords that none of the kernel package's own calls of it passes: TypeError in the compiled module",
                "`self._cached_module.plan(..., torch.cuda.current_stream().cuda_stream)`: 16 positionals where flashinfer's "
                "own calls pass 15"),),
    "MXA120": ((E, "the port imports a name the installed kernel package does not provide: ImportError",
                "`from flashinfer.decode import _gone`"),
               (I, "every import of the name is guarded (try/except ImportError): the fallback runs, the guard is the evidence",
                "`try: from flashinfer import trtllm_decode except ImportError: trtllm_decode = None`"),),
    "MXA122": ((E, "the port imports a module or name its provider (the port snapshot or the upstream release) does not define: "
                   "ImportError when the module loads, or when the function with the lazy import runs",
                "`from vllm.v1.attention.backends.utils import get_kv_cache_layout` after upstream removed it"),
               (I, "the import is guarded (try/except ImportError, an availability check): the guard is the evidence",
                "`try: from vllm_port._build_info import __version__ except ImportError: __version__ = 'dev'`"),),
    "MXA123": ((E, "a name imported only under `if TYPE_CHECKING:` is evaluated at runtime (code or an eager annotation): "
                   "NameError when the module is imported or the code runs",
                "`def plan(self, spec: KVCacheSpec) -> None` without `from __future__ import annotations`, KVCacheSpec imported for typing only"),),
    "MXA127": ((E, "a name no scope on the path binds (not a local, a module-level name, a star import of a read module, "
                   "nor a builtin) is read: NameError when the code runs, at import for module-level code",
                "`F.linear(x, w)` after `import torch.nn.functional as F` was deleted"),),
    "MXA121": ((I, "an import could not be checked because the kernel package is not importable here",
                "`from flash_mla import flash_mla_with_kvcache` with flash_mla absent on the audit machine"),),
    "MXA125": ((E, "an attribute read on self, a class or super() that no class in its MRO defines: AttributeError when it runs",
                "`self.q_data_type_prefill` in a port class whose bases never assign it"),),
    "MXA126": ((E, "an attribute read on an imported module that the module does not define: AttributeError when it runs",
                "`ops.cp_gather_cache_v2(...)` where vllm._custom_ops has no such function"),),
    "MXA130": ((W, "a host synchronisation (.item(), .cpu(), .tolist()) on a path the backend declares capturable",
                "`n = q.max().item()` in forward of a backend declaring AttentionCGSupport.ALWAYS"),
               (I, "the synchronisation is on a path capture never takes (prefill, a None guard)",
                "`.tolist()` in `_prefill_attention`")),
    "MXA131": ((W, "Python branches on a tensor value on a capturable path: the captured graph freezes one branch",
                "`if seq_lens.max() > 128:` in forward"),),
    "MXA132": ((I, "a per-call buffer allocation on a capturable path (works, but costs memory per replay)",
                "`torch.empty(n, device=q.device)` in forward"),),
    "MXA140": ((I, "a comment claims a checkable property (dtype, head size, arch, layout, block size) the code does not enforce",
                "`# only supports head sizes 64 and 128` above code that accepts any head size"),),
    "MXA141": ((I, "the claim is enforced by the code it describes (raise, assert, switch, padding to the limit)",
                "`# fp8 kv cache is not supported` above `raise NotImplementedError`"),),
    "MXA142": ((W, "a comment lists a feature as unsupported while code in the file uses it",
                "`# does not support: - FancyWrapper` while `FancyWrapper(...)` is called below"),),
    "MXA201": ((W, "an undeclared difference that can change what a kernel computes or whether it runs: kernel/op call "
                   "arguments the stack does not explain, dtype/scale/layout/LSE/causal/shape expressions, control flow "
                   "around a kernel call, a capability hook or supported list the port widens",
                "`merge_attn_states(out, ctx_out, ctx_lse, ...)` where upstream passes `[x * _LN2 for x in ctx_lse]`"),
               (I, "a known vendor adaptation, with the reason in the evidence: a keyword dropped because the installed "
                   "signature lacks it, a swap to the port's own class or op, a field only the port adds, a capability the "
                   "port answers itself, a list the port narrows, an import from the port's own module, an upstream member "
                   "the port does not provide, a statement moved within its function, a removed local that upstream only "
                   "passes as a keyword the installed kernel lacks, removed statements that only write a log line; or code "
                   "on a path the vendor never runs (another platform's branch, a branch under a predicate constant on the "
                   "vendor platform or under a value the port fixes - a port function that returns a constant, an attribute "
                   "set from one -, a function the port never calls, a case the port rejects up front), with the gate as "
                   "evidence; or a change that touches no kernel argument, dtype, scale, layout, LSE, causal or shape expression",
                "`self.compressor = MacaDeepseekCompressor(...)` for upstream's `DeepseekCompressor(...)`: swap to the port's own class")),
    "MXA202": ((W, "a capability check that is not constant on the vendor platform decides a kernel path, and nothing explains it",
                "`if kv_cache_dtype == 'fp8' and not current_platform.has_device_capability(89): raise ...` removed: the "
                "port runs fp8 where upstream refuses devices below 8.9"),
               (I, "the predicate is constant on the vendor platform (its platform file answers it), the port replaced an "
                   "NVIDIA floor with its own answer, the port removed a guard that only rejects on one NVIDIA architecture "
                   "(`if is_device_capability(90) and ...: raise`, a workaround for that architecture's kernels), the removed "
                   "statements only write a log line, the check is inherited unchanged from upstream, sits on a path the "
                   "vendor never runs, only its message text differs, or it is declared",
                "`128 if current_platform.is_device_capability_family(100) else 64` where the platform's "
                "is_device_capability_family returns False")),
    "MXA203": ((W, "upstream changed a kernel-relevant line, signature, capability hook or kernel argument after the base "
                   "release and the port kept the old form (hunks of one function, or one edit missed in several "
                   "functions, are one finding; the function's port-only differences join it)",
                "`get_kv_cache_stride_order`: upstream 0.26.0 changed the stride orders, the port keeps 0.25.0's"),
               (I, "the change is on a path the vendor never runs (a function the port never calls, a branch its platform "
                   "never takes), passes an argument to a port function that answers a constant whatever its arguments, "
                   "touches no kernel argument/dtype/scale/layout/shape, is a non-hook member, or is declared",
                "`_trtllm_prefill_attn_kvfp8_dequant` changed upstream; the port never calls it")),
    "MXA204": ((I, "an upstream change between the base and target release that the port took; context for the reviewer",
                "`mla_attention.py:1078` follows the new `kv_quant_mode=`"),),
    "MXA205": ((I, "a port file with no upstream counterpart; it is audited on its own",
                "`vllm_metax/v1/attention/backends/cp_utils.py`"),),
    "MXA206": ((W, "a port file or its upstream counterpart could not be parsed, so no differences were computed",
                "upstream counterpart `vllm/v1/attention/backends/x.py` could not be read"),),
    "MXA207": ((E, "the override drops a parameter the upstream base requires and an upstream call site passes it, or one an "
                   "upstream call names by keyword: TypeError whenever that call runs",
                "`MacaImpl.forward(self, layer, q, k, v, kv_cache, attn_metadata)` without the `output` upstream's caller passes"),
               (W, "the override drops or adds a parameter the base method's interface has, with no upstream call site proving a break, "
                   "or only callers the port replaces (assigns over) or overrides in every class derived from theirs",
                "`build(self, common_prefix_len, common_attn_metadata)` drops upstream's optional `fast_build`")),
    "MXA208": ((E, "the port class lacks an abstract method of its upstream base and the port constructs it or returns it from "
                   "get_impl_cls/get_builder_cls: TypeError when vLLM instantiates it",
                "`AscendMLAImpl` without `forward_mha`, abstract in vLLM's MLAAttentionImpl, returned by get_impl_cls"),
               (W, "the port class does not define an abstract method of its upstream base: instantiating it raises TypeError",
                "`MacaFlashInferBackend` without the abstract `get_kv_cache_stride_order` of its ABC base"),),
    "MXA209": ((W, "the last sync left the file in the base release's form: its functions that keep the earlier form are one "
                   "finding, each function a site (joined to the module's import of a name upstream removed, when there is one)",
                "flashinfer.py keeps 0.25's KV-cache layout in get_kv_cache_shape, forward and do_kv_cache_update"),),
    "MXA210": ((W, "a waiver matches no finding: it is stale and may hide a future finding",
                "waiver for MXA201 at flashinfer.py `FlashInferImpl.forward` after the function was rewritten"),),
    "MXA211": ((W, "a waiver is past its expiry date",
                "`expires: 2026-10-01` on a waiver reviewed 2026-12-01"),),
    "MXA160": ((I, "a pinned kernel package is bound statically against the public release its vendor build derives "
                   "from, because the pinned build is not what is installed here",
                "`flash_attn==2.6.3+metax3.8.0.7` pinned, not installed: bound to the public flash_attn 2.6.3 sources"),),
    "MXA161": ((W, "the pinned version is neither installed nor obtainable as a public base, accepted with allow-unbound, "
                   "and calls into it were checked against another installed version: findings about it may not hold "
                   "on the pinned stack",
                "`flashinfer==0.2.2+metax...` pinned, 0.2.6 installed, no public 0.2.2 obtainable"),
               (I, "the pinned version is neither installed nor obtainable, accepted with allow-unbound, and nothing "
                   "else is installed: its calls were not checked (a coverage gap, counted in every headline)",
                "`flash_mla==1.0.1+metax...` pinned: no public release of flash_mla 1.0.1, none installed")),
    "MXA170": ((E, "a torch.ops use or an op-referencing call names an op that no provider read (port Python and C++, "
                   "upstream Python and compiled extensions, manifest) registers: AttributeError on first call",
                "`torch.ops._C.fused_qnorm_rope_insert(...)` after the C++ `.def` of that op was dropped"),),
    "MXA171": ((W, "an `\"ns::op\"` string in a configuration list names no registered op while a registered op of a "
                   "similar name is missing from the list (renamed under it), so what the list asks for (a piecewise "
                   "graph split) never happens for the op that runs",
                "`_attention_ops.append(\"vllm::attn_v1\")` after the op became `vllm::attn_v2`"),
               (I, "the string names no registered op and no registered op of a similar name is missing from the lists: "
                   "a stale entry that asks for nothing",
                "`compilation_config._attention_ops.append(\"vllm::old_attention_op\")` after the op was removed")),
    "MXA172": ((I, "the op's provider cannot be read statically here (a compiled package, a computed name); not "
                   "evidence that the op is missing",
                "`torch.ops.sgl_kernel.gate(...)` with no manifest of the stack"),),
    "MXA174": ((E, "`torch.ops.<ns>(...)` calls the op namespace itself, which is not callable: TypeError at the call",
                "`torch.ops._C(query, key)` where `torch.ops._C.rotary_embedding(query, key)` was meant"),
               (W, "the same call under a hasattr/try guard: the fallback always runs instead",
                "`torch.ops._C(x) if hasattr(torch.ops._C, 'op') else ref(x)`")),
    "MXA175": ((E, "a custom op's fake implementation takes other parameters than the registered function (whose parameters "
                   "are the schema), or a `torch.ops.<ns>.<op>(...)` call does not bind to them: it raises when traced or called",
                "`direct_register_custom_op(\"op\", op, fake_impl=op_fake)` with `op(q, k, out)` and `op_fake(q, k)`"),),
    "MXA173": ((I, "the use of an unregistered op sits under a hasattr/try guard, so the fallback runs",
                "`torch.ops._C.x(...) if hasattr(torch.ops._C, \"x\") else fallback(...)`"),),
    "MXA180": ((E, "the impl's constructor raises or asserts for a value the backend advertises to the selector: "
                   "the model fails to load for that configuration",
                "`supported_kv_cache_dtypes` lists \"fp8\" while `__init__` raises NotImplementedError for fp8"),),
    "MXA181": ((W, "an impl method raises or asserts for an advertised value: requests on that path fail at run time",
                "`supports_attn_type` accepts ENCODER_ONLY while `forward` asserts attn_type == DECODER"),),
    "MXA182": ((I, "the guard against an advertised value is the same in upstream's counterpart: upstream's limitation",
                "an encoder path rejecting a quantized KV cache, as upstream does"),),
    "MXA184": ((E, "the backend advertises a quantized KV-cache dtype whose only path runs a port CustomOp whose forward_oot "
                   "only raises NotImplementedError (what an out-of-tree platform dispatches to): every such request fails",
                "FLASHMLA lists 'fp8'; the MLA layer quantizes the decode query through a CustomOp whose forward_oot raises"),),
    "MXA185": ((W, "the platform's check_and_update_config appends to an attribute upstream declares as a class-level list: "
                   "every config check adds the entries again",
                "`compilation_config._attention_ops.append(\"vllm::my_op\")` where upstream has `_attention_ops: ClassVar[list[str]]`"),),
    "MXA183": ((W, "the backend advertises non-causal attention but a kernel call fixes causal=True where upstream passes "
                   "the request's flag: those requests get a causal mask",
                "`prefill_wrapper.plan(..., causal=True)` where upstream passes `causal=attn_metadata.causal`"),
               (E, "and the backend's own code asserts the wrapper's recorded causal flag equals the request's: a "
                   "non-causal request fails that assert",
                "`plan(causal=True)` on the non-causal wrapper, then `assert wrapper._causal == attn_metadata.causal`"),),
    "MXA212": ((W, "calls of one callee leave out keywords upstream passes at several call sites, nothing else there may "
                   "change a kernel, and the installed signature is unknown: one finding with every call site",
                "`flash_attn_varlen_func(...)` without fa_version/q_descale at 5 calls in 4 functions, flash_attn not bound"),),
    "MXA213": ((W, "the port call standing where upstream's call stands leaves out a keyword that upstream's call and the "
                   "port's other calls of the same kernel pass: that path runs with the keyword's default",
                "the else branch's `flash_attn_varlen_func(...)` without `s_aux=self.sinks`, which the split path's calls pass"),),
    "MXA300": ((I, "an adaptation sits behind a feature the platform switches off; the gate is the evidence",
                "8 cascade places in flashinfer.py behind `disable_cascade_attn = True`"),),
    "MXA407": ((E, "an add-on probe measured semantics different from the expected hypothesis",
                "the h2o probe's scores do not sum to the group size"),),
    "MXA417": ((W, "an add-on probe could not finish: the target raised, crashed or hung",
                "h2o probe: target raised RuntimeError (CUDA out of memory)"),),
    "MXA420": ((I, "the target lacks a control the probe needs; the contract stays unvalidated",
                "layout probe: `run()` has no kv_layout argument"),),
    "MXA500": ((E, "a recorded kernel contract is contradicted by its probe on this machine",
                "component-contracts.md says base-e LSE; the probe measures base 2"),),
    "MXA501": ((I, "a contract was observed on another kernel version than the one installed",
                "observed on flashinfer 0.2.5, installed 0.2.6.post1"),),
    "MXA510": ((E, "an LSE in one log base reaches a merge that assumes the other (all arguments of one call are one finding)",
                "FlashInfer prefill LSE (base 2) reaches `merge_attn_states(prefix_lse=, suffix_lse=)` (base e) without `* ln 2`"),),
    "MXA511": ((E, "an LSE reaches its consumer in the other layout",
                "[tokens, heads] LSE passed where the merge reads [heads, tokens]"),),
    "MXA512": ((E, "a result is unpacked as if it held the LSE, but the call does not ask for it",
                "`out, lse = flash_attn_varlen_func(...)` without `return_softmax_lse=True`"),
               (I, "the same, at a call that runs only with a feature the platform turns off on every run (its branch, or "
                   "every port caller of its function, requires the feature; the switch and the branch are the gate)",
                "`cascade_attention` called only after `if not attn_metadata.use_cascade: ... return`, with "
                "`disable_cascade_attn = True` in check_and_update_config")),
    "MXA513": ((W, "a KV scale is passed as a Python float where the kernel's contract wants a tensor (or the reverse)",
                "`k_scale=layer._k_scale_float` to a kernel that reads a device tensor"),),
    "MXA514": ((E, "the K and V scales are swapped at a kernel call",
                "`run(q, kv, k_scale=layer._v_scale, v_scale=layer._k_scale)`"),),
}
for _n, _probe in _PROBES.items():
    SEVERITY[f"MXA{_n}"] = ((E, f"the {_probe} probe measured semantics other than the expected hypothesis",
                             _PROBE_EXAMPLES[_probe]),)
    SEVERITY[f"MXA4{int(_n[1:]) + 10}"] = ((W, f"the {_probe} probe could not finish: the target raised, crashed or hung",
                                           f"{_probe} probe: the target raised RuntimeError"),)
# Triage's never-taken-branch demotion applies to every rule whose consequence happens where its statement runs
# (stages/never_taken.py): the same condition, said once per rule.
from metax_audit.stages.never_taken import AT_STATEMENT as _AT_STATEMENT  # noqa: E402

_NEVER_TAKEN = (I, "the same, where every place of the finding lies inside a branch the vendor platform never takes, or "
                   "in a private method the port binds or calls only inside such branches (the platform class's answers, "
                   "followed into the port's helpers and its `self.` flags, decide the test; the branch is the gate)",
                "`ops.persistent_topk(...)` read only under `if current_platform.is_cuda() and ...`: False on an "
                "out-of-tree platform (`_enum = PlatformEnum.OOT`)")
for _rule in sorted(_AT_STATEMENT & SEVERITY.keys()):
    SEVERITY[_rule] = (*SEVERITY[_rule], _NEVER_TAKEN)
