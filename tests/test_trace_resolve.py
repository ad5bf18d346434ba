# Each resolution rule of the tracer on a synthetic port, with a negative twin: a similarly named
# but unrelated callable must not be matched (stubtest-style case tables).
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from test_trace_support import PORT, calls_to, run_trace, unresolved_texts

DEMO = f"{PORT}.v1.attention.backends.demo"


@dataclass(frozen=True)
class Case:
    id: str
    body: str  # methods of DemoImpl
    callee: str  # callee text as written
    resolved: str | None  # expected dotted target; None: must be unresolved
    via: str | None = None
    reason: str = ""  # substring of the unresolved reason
    extra: dict[str, str] = field(default_factory=dict)
    origin: str | None = None


OPS = {
    f"{PORT}/v1/attention/ops/__init__.py": "from .impl import fused_kernel\n",
    f"{PORT}/v1/attention/ops/impl.py": "def fused_kernel(q):\n    return q\n\ndef other_kernel(q):\n    return q\n",
    f"{PORT}/v1/attention/ops/merge.py": "def merge_attn_states(a, b):\n    return a\n",
    f"{PORT}/v1/attention/ops2/__init__.py": "",
    f"{PORT}/v1/attention/ops2/merge.py": "def merge_attn_states(a, b):\n    return b\n",
}

CASES = [
    # import alias
    Case(
        "alias",
        """
        def forward(self, layer, q):
            from flashinfer import BatchDecodeWithPagedKVCacheWrapper as Dec
            return Dec(q)
        """,
        "Dec",
        "flashinfer.BatchDecodeWithPagedKVCacheWrapper",
        origin="external",
    ),
    Case(
        "alias-negative-local-namesake",
        """
        def forward(self, layer, q):
            return BatchDecodeWithPagedKVCacheWrapper(q)
        """,
        "BatchDecodeWithPagedKVCacheWrapper",
        f"{PORT}.v1.attention.backends.other.BatchDecodeWithPagedKVCacheWrapper",
        extra={
            f"{PORT}/v1/attention/backends/other.py": "class BatchDecodeWithPagedKVCacheWrapper:\n    pass\n",
            # the demo module imports the port's namesake, not flashinfer's class
            "__prepend__": "from mxport.v1.attention.backends.other import BatchDecodeWithPagedKVCacheWrapper\n",
        },
        origin="port",
    ),
    # relative imports
    Case(
        "relative-import",
        """
        def forward(self, layer, q):
            from ..ops.merge import merge_attn_states
            return merge_attn_states(q, q)
        """,
        "merge_attn_states",
        f"{PORT}.v1.attention.ops.merge.merge_attn_states",
        extra=OPS,
    ),
    Case(
        "relative-import-negative-sibling-package",
        """
        def forward(self, layer, q):
            from ..ops2.merge import merge_attn_states
            return merge_attn_states(q, q)
        """,
        "merge_attn_states",
        f"{PORT}.v1.attention.ops2.merge.merge_attn_states",
        extra=OPS,
    ),
    # re-export through a package __init__
    Case(
        "re-export",
        """
        def forward(self, layer, q):
            return fused_kernel(q)
        """,
        "fused_kernel",
        f"{PORT}.v1.attention.ops.impl.fused_kernel",
        via="re-export",
        extra={**OPS, "__prepend__": f"from {PORT}.v1.attention.ops import fused_kernel\n"},
    ),
    Case(
        "re-export-negative-not-exported",
        """
        def forward(self, layer, q):
            return other_kernel(q)
        """,
        "other_kernel",
        None,
        reason="not defined",
        extra={**OPS, "__prepend__": f"from {PORT}.v1.attention.ops import other_kernel\n"},
    ),
    # self attribute assigned in a helper method
    Case(
        "self-attr-helper",
        """
        def _make(self):
            if self._decode_wrapper is None:
                self._decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
            return self._decode_wrapper

        def forward(self, layer, q):
            self._make()
            return self._decode_wrapper.run(q)
        """,
        "self._decode_wrapper.run",
        "flashinfer.BatchDecodeWithPagedKVCacheWrapper.run",
        via="self-attr",
        extra={"__prepend__": "from flashinfer import BatchDecodeWithPagedKVCacheWrapper\n"},
    ),
    Case(
        "self-attr-negative-other-class",
        """
        def forward(self, layer, q):
            return self._decode_wrapper.run(q)
        """,
        "self._decode_wrapper.run",
        None,
        reason="base has no readable source",
        extra={
            "__prepend__": "from flashinfer import BatchPrefillWithPagedKVCacheWrapper\n",
            "__append__": "class Unrelated:\n    def __init__(self):\n        self._decode_wrapper = BatchPrefillWithPagedKVCacheWrapper(None)\n",
        },
    ),
    # functools.partial
    Case(
        "partial",
        """
        def __init__(self, num_heads):
            self._combine = partial(merge_lse, is_lse_base_on_e=False)

        def forward(self, layer, q):
            return self._combine(q, q)
        """,
        "self._combine",
        "vllm.v1.attention.ops.common.merge_lse",
        via="partial",
        extra={"__prepend__": "from functools import partial\nfrom vllm.v1.attention.ops.common import merge_lse\n"},
        origin="upstream",
    ),
    Case(
        "partial-negative-local-function-named-partial",
        """
        def __init__(self, num_heads):
            self._combine = partial(merge_lse, is_lse_base_on_e=False)

        def forward(self, layer, q):
            return self._combine(q, q)
        """,
        "self._combine",
        None,
        reason="result of",
        extra={"__prepend__": "from vllm.v1.attention.ops.common import merge_lse\n\ndef partial(f, **kw):\n    return kw\n"},
    ),
    # lazy import inside a function
    Case(
        "lazy-import",
        """
        def forward(self, layer, q):
            if q is not None:
                from flash_attn import flash_attn_varlen_func
            return flash_attn_varlen_func(q)
        """,
        "flash_attn_varlen_func",
        "flash_attn.flash_attn_varlen_func",
        via="lazy-import",
        origin="external",
    ),
    Case(
        "lazy-import-negative-other-function",
        """
        def _helper(self):
            from flash_attn import flash_attn_varlen_func
            return flash_attn_varlen_func

        def forward(self, layer, q):
            return flash_attn_varlen_func(q)
        """,
        "flash_attn_varlen_func",
        None,
        reason="not defined",
    ),
    # getattr with a literal name
    Case(
        "getattr-literal",
        """
        def forward(self, layer, q):
            fn = getattr(kops, "fused_kernel")
            return fn(q)
        """,
        "fn",
        f"{PORT}.v1.attention.ops.impl.fused_kernel",
        via="getattr",
        extra={**OPS, "__prepend__": f"import {PORT}.v1.attention.ops.impl as kops\n"},
    ),
    Case(
        "getattr-negative-computed-name",
        """
        def forward(self, layer, q, name):
            fn = getattr(kops, name)
            return fn(q)
        """,
        "fn",
        None,
        reason="dynamic attribute",
        extra={**OPS, "__prepend__": f"import {PORT}.v1.attention.ops.impl as kops\n"},
    ),
    # unknown parameter types are reported as such, never guessed
    Case(
        "parameter-of-unknown-type",
        """
        def forward(self, layer, q, runner):
            return runner.launch(q)
        """,
        "runner.launch",
        None,
        reason="parameter of unknown type",
    ),
    Case(
        "annotated-parameter",
        """
        def forward(self, layer, q, runner: BatchPrefillWithRaggedKVCacheWrapper):
            return runner.run(q)
        """,
        "runner.run",
        "flashinfer.BatchPrefillWithRaggedKVCacheWrapper.run",
        extra={"__prepend__": "from flashinfer import BatchPrefillWithRaggedKVCacheWrapper\n"},
    ),
]


def _split(extra: dict[str, str]) -> tuple[dict[str, str], str, str]:
    files = {k: v for k, v in extra.items() if not k.startswith("__")}
    return files, extra.get("__prepend__", ""), extra.get("__append__", "")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_resolution_rule(tmp_path, case: Case, monkeypatch):
    files, prepend, append = _split(case.extra)
    import test_trace_support as support

    monkeypatch.setattr(support, "BACKEND", prepend + support.BACKEND + "\n" + append)
    result = run_trace(tmp_path, body=case.body, extra=files)
    sites = [c for c in calls_to(result, case.callee) if c.origin != "unresolved"]
    if case.resolved is None:
        assert not sites, f"{case.callee} must not resolve, got {[s.resolved for s in sites]}"
        reasons = unresolved_texts(result)
        assert case.callee in reasons, f"{case.callee} missing from unresolved {reasons}"
        assert case.reason in reasons[case.callee]
        return
    assert [s.resolved for s in sites] == [case.resolved]
    if case.via:
        assert sites[0].via == case.via
    if case.origin:
        assert sites[0].origin == case.origin
    assert case.callee not in unresolved_texts(result)


def test_partial_records_bound_arguments(tmp_path, monkeypatch):
    import test_trace_support as support

    monkeypatch.setattr(support, "BACKEND", "from functools import partial\nfrom vllm.v1.attention.ops.common import merge_lse\n" + support.BACKEND)
    body = """
    def __init__(self, num_heads):
        self._combine = partial(merge_lse, is_lse_base_on_e=False)

    def forward(self, layer, q):
        return self._combine(q, q, return_lse=True)
    """
    site = next(c for c in calls_to(run_trace(tmp_path, body=body), "self._combine") if c.via == "partial")
    assert [(a.name, a.literal) for a in site.partial_args] == [("is_lse_base_on_e", "False")]
    assert [(a.name, a.position, a.literal) for a in site.args] == [(None, 0, None), (None, 1, None), ("return_lse", None, "True")]
