# Tests of the discover stage on small port trees written by each test: scope and PATHS,
# registrations and their resolution, priorities, switches, callers, widen and the rules.
from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest
from conftest import write_tree

from metax_audit.core.config import AuditConfig
from metax_audit.core.errors import DiscoverError
from metax_audit.core.models import Discovery
from metax_audit.demo import port_root
from metax_audit.stages.discover import coverage_findings, discover, registration_findings, widen

CFG = AuditConfig()
BACKENDS = "vllm_metax/v1/attention/backends"


def base_tree(extra: dict[str, str] | None = None) -> dict[str, str]:
    files = {
        "vllm_metax/__init__.py": "",
        "vllm_metax/v1/__init__.py": "",
        "vllm_metax/v1/attention/__init__.py": "",
        f"{BACKENDS}/__init__.py": "",
        f"{BACKENDS}/flashinfer.py": "class MacaFlashInferBackend:\n    pass\n",
        "vllm_metax/v1/attention/ops/__init__.py": "",
        "vllm_metax/v1/attention/ops/merge.py": "def merge_attn_states(*a):\n    return a\n",
        "vllm_metax/platform.py": "",
        "vllm_metax/utils.py": "X = 1\n",
    }
    files.update(extra or {})
    return files


def run(tmp_path: Path, extra: dict[str, str] | None = None, paths: tuple[str, ...] = ()) -> Discovery:
    return discover(write_tree(tmp_path, base_tree(extra)), CFG, paths)


def rules_of(d: Discovery) -> list[tuple[str, str]]:
    return sorted((f.rule, f.location.symbol) for f in registration_findings(d))


# ------------------------------------------------------------------ scope


def test_default_scope_holds_attention_files_and_platform(tmp_path: Path) -> None:
    d = run(tmp_path, {"vllm_metax/models/foo/attention.py": "", "vllm_metax/models/foo/other.py": ""})
    by_path = {f.path: f for f in d.files}
    assert by_path["vllm_metax/platform.py"].reason == "platform"
    assert by_path[f"{BACKENDS}/flashinfer.py"].reason == "glob"
    assert by_path[f"{BACKENDS}/flashinfer.py"].module == "vllm_metax.v1.attention.backends.flashinfer"
    assert by_path[f"{BACKENDS}/__init__.py"].module == "vllm_metax.v1.attention.backends"
    assert "vllm_metax/models/foo/attention.py" in by_path
    assert "vllm_metax/models/foo/other.py" not in by_path
    assert "vllm_metax/utils.py" not in by_path
    assert d.left_out == ()


@pytest.mark.parametrize("folder", ["vllm_metax/registry/custom_ops/layers/sparse_attn_indexer",
                                    "vllm_metax/customized/layers/sparse_attn_indexer"])
def test_default_scope_holds_the_sparse_indexer_ops_in_either_layout(tmp_path: Path, folder: str) -> None:
    # The port kept its sparse-indexer ops under customized/layers/ up to v0.25 and moved them to
    # registry/custom_ops/layers/: in either, they are in scope (all their imports bound), not mere callers.
    d = run(tmp_path, {f"{folder}/__init__.py": "", f"{folder}/fp8.py": "X = 1\n",
                       "vllm_metax/customized/layers/other.py": ""})
    by_path = {f.path: f for f in d.files}
    assert by_path[f"{folder}/fp8.py"].reason == "glob"
    assert "vllm_metax/customized/layers/other.py" not in by_path


@pytest.mark.parametrize("rel", ["vllm_metax/customized/layers/sparse_attn_indexer.py",  # v0.17: one module
                                 "vllm_metax/models/deepseek_v4/ops/fused_indexer_q.py"])  # a model's indexer op
def test_default_scope_holds_indexer_modules(tmp_path: Path, rel: str) -> None:
    d = run(tmp_path, {rel: "X = 1\n", "vllm_metax/models/deepseek_v4/ops/other.py": ""})
    by_path = {f.path: f for f in d.files}
    assert by_path[rel].reason == "glob"
    assert "vllm_metax/models/deepseek_v4/ops/other.py" not in by_path


def test_default_scope_holds_the_pluggable_mla_wrapper_of_the_older_layout(tmp_path: Path) -> None:
    # up to v0.25 the DeepSeek-V4 MLA wrapper was customized/pluggable_layer/deepseek_v4_attention.py
    layer = "vllm_metax/customized/pluggable_layer"
    d = run(tmp_path, {f"{layer}/__init__.py": "", f"{layer}/deepseek_v4_attention.py": "", f"{layer}/gate_linear.py": ""})
    by_path = {f.path: f for f in d.files}
    assert by_path[f"{layer}/deepseek_v4_attention.py"].reason == "glob"
    assert f"{layer}/gate_linear.py" not in by_path


def test_paths_narrow_scope_and_record_what_was_left_out(tmp_path: Path) -> None:
    d = run(tmp_path, paths=("./vllm_metax/v1/attention/ops/", "vllm_metax/utils.py"))
    kept = {f.path: f.reason for f in d.files}
    assert kept == {
        "vllm_metax/v1/attention/ops/__init__.py": "glob",
        "vllm_metax/v1/attention/ops/merge.py": "glob",
        "vllm_metax/utils.py": "explicit",
    }
    left = {s.path for s in d.left_out}
    assert f"{BACKENDS}/flashinfer.py" in left and "vllm_metax/platform.py" in left
    assert all(s.reason for s in d.left_out)


def test_paths_accept_globs(tmp_path: Path) -> None:
    d = run(tmp_path, paths=("vllm_metax/v1/attention/*/merge.py",))
    assert [f.path for f in d.files] == ["vllm_metax/v1/attention/ops/merge.py"]


@pytest.mark.parametrize(("paths", "message"), [
    (("vllm_metax/nope.py",), "matches no file"),
    (("does/not/exist",), "matches no file"),
    (("../outside.py",), "inside it"),
    (("/etc/hostname",), "inside it"),
    (("vllm_metax/notes.txt",), "not a Python file"),
])
def test_bad_paths_are_an_error(tmp_path: Path, paths: tuple[str, ...], message: str) -> None:
    write_tree(tmp_path, {"vllm_metax/notes.txt": "x"})
    with pytest.raises(DiscoverError, match=message):
        run(tmp_path, paths=paths)


def test_missing_port_package_is_an_error(tmp_path: Path) -> None:
    write_tree(tmp_path, {"other/__init__.py": ""})
    with pytest.raises(DiscoverError, match="port-package"):
        discover(tmp_path, CFG)


def test_broken_and_huge_files_are_recorded_not_dropped(tmp_path: Path) -> None:
    huge = "".join(f"value_{i} = {i}\n" for i in range(400_000))
    assert len(huge) > 5_000_000
    start = time.perf_counter()
    d = run(tmp_path, {
        f"{BACKENDS}/broken.py": "def f(:\n    pass\n",
        f"{BACKENDS}/generated.py": huge,
        f"{BACKENDS}/latin.py": b"x = '\xe9'\n".decode("latin-1"),
    })
    assert time.perf_counter() - start < 5
    by_path = {f.path: f for f in d.files}
    assert by_path[f"{BACKENDS}/broken.py"].parse_error.startswith("SyntaxError")
    assert by_path[f"{BACKENDS}/generated.py"].parse_error.startswith("too large")
    assert by_path[f"{BACKENDS}/flashinfer.py"].parse_error is None
    found = {(f.rule, f.location.path, f.location.line) for f in coverage_findings(d)}
    assert ("MXA001", f"{BACKENDS}/broken.py", 1) in found
    assert ("MXA002", f"{BACKENDS}/generated.py", 0) in found
    assert not any(path.endswith("flashinfer.py") for _, path, _ in found)


def test_huge_file_is_parsed_when_the_limit_allows(tmp_path: Path) -> None:
    write_tree(tmp_path, base_tree({f"{BACKENDS}/generated.py": "x = 1\n" * 10}))
    d = discover(tmp_path, AuditConfig(max_file_bytes=40))
    assert {f.path: f.parse_error for f in d.files}[f"{BACKENDS}/generated.py"].startswith("too large")
    d = discover(tmp_path, AuditConfig(max_file_bytes=100))
    assert {f.path: f.parse_error for f in d.files}[f"{BACKENDS}/generated.py"] is None


# ------------------------------------------------------------------ registrations

PLATFORM_HEAD = """\
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
"""

REGISTRATION_CASES = [
    # (id, file, source, expected (kind, name, class_path) or None)
    ("positional", "vllm_metax/platform.py",
     PLATFORM_HEAD + 'register_backend(AttentionBackendEnum.FLASHINFER, class_path="vllm_metax.v1.attention.backends.flashinfer.MacaFlashInferBackend")\n',
     ("attention-backend", "FLASHINFER", "vllm_metax.v1.attention.backends.flashinfer.MacaFlashInferBackend")),
    ("keywords", "vllm_metax/platform.py",
     PLATFORM_HEAD + 'def reg():\n    register_backend(backend=AttentionBackendEnum.X, class_path="a.b.C")\n',
     ("attention-backend", "X", "a.b.C")),
    ("positional-path", "vllm_metax/platform.py",
     PLATFORM_HEAD + 'register_backend(AttentionBackendEnum.X, "a.b.C")\n',
     ("attention-backend", "X", "a.b.C")),
    ("decorator", f"{BACKENDS}/custom.py",
     PLATFORM_HEAD + "@register_backend(AttentionBackendEnum.CUSTOM)\nclass MyBackend:\n    pass\n",
     ("decorator", "CUSTOM", "vllm_metax.v1.attention.backends.custom.MyBackend")),
    ("mla-prefill", "vllm_metax/platform.py",
     'def reg():\n    from x import register_mla_prefill_backend\n'
     '    register_mla_prefill_backend(backend=MLAPrefillBackendEnum.FLASH_ATTN, class_path="p.q.R")\n',
     ("mla-prefill", "FLASH_ATTN", "p.q.R")),
    ("customop-register", f"{BACKENDS}/ops_layer.py",
     'from vllm.model_executor.custom_op import CustomOp\n@CustomOp.register("mx_indexer")\nclass Indexer(CustomOp):\n    pass\n',
     ("custom-op", "mx_indexer", "vllm_metax.v1.attention.backends.ops_layer.Indexer")),
    ("register-oot-bare", f"{BACKENDS}/ops_layer.py",
     "from vllm.x import UpstreamAttn\n@UpstreamAttn.register_oot\nclass MacaAttn(UpstreamAttn):\n    pass\n",
     ("custom-op", "UpstreamAttn", "vllm_metax.v1.attention.backends.ops_layer.MacaAttn")),
    ("register-oot-call", f"{BACKENDS}/ops_layer.py",
     'class MacaAttn:\n    pass\nCustomOp.register_oot(_decorated_op_cls=MacaAttn, name="Attn")\n',
     ("custom-op", "Attn", "vllm_metax.v1.attention.backends.ops_layer.MacaAttn")),
    ("direct-op", f"{BACKENDS}/ops_layer.py",
     'def mx_op(x):\n    return x\ndirect_register_custom_op(op_name="mx_op", op_func=mx_op, mutates_args=[])\n',
     ("custom-op", "mx_op", "vllm_metax.v1.attention.backends.ops_layer.mx_op")),
    # negatives: same names, other meaning
    ("torch-dist-backend", "vllm_metax/platform.py",
     'import torch.distributed as dist\ndist.Backend.register_backend("maca", lambda *a: None)\n', None),
    ("string-keyed-factory", "vllm_metax/platform.py",
     'Factory.register_backend("cumem", "vllm_metax.alloc", "CuMemBackend")\n'
     'Factory.register_backend(name="x", class_path="a.b.C")\n', None),
    ("atexit-register", f"{BACKENDS}/ops_layer.py", "import atexit\n@atexit.register\ndef bye():\n    pass\n", None),
    ("other-register", f"{BACKENDS}/ops_layer.py",
     '@registry.register("thing")\nclass Thing:\n    pass\n', None),
    ("def-named-like-it", "vllm_metax/platform.py",
     "def register_backend(backend, class_path=None):\n    return None\n", None),
    ("commented-call", "vllm_metax/platform.py",
     '# register_backend(AttentionBackendEnum.X, class_path="a.b.C")\n', None),
]


@pytest.mark.parametrize(("rel", "source", "expected"), [c[1:] for c in REGISTRATION_CASES],
                         ids=[c[0] for c in REGISTRATION_CASES])
def test_registration_forms(tmp_path: Path, rel: str, source: str, expected: tuple[str, str, str] | None) -> None:
    d = run(tmp_path, {rel: source})
    got = [(r.kind, r.name, r.class_path) for r in d.registrations]
    assert got == ([expected] if expected else [])
    if expected:
        reg = d.registrations[0]
        assert reg.location.path == rel
        assert source.splitlines()[reg.location.line - 1].lstrip().startswith(("register", "@", "direct", "Custom"))


RESOLVE_CASES = [
    # (id, extra files, class path, resolved_path or None)
    ("direct", {}, "vllm_metax.v1.attention.backends.flashinfer.MacaFlashInferBackend", f"{BACKENDS}/flashinfer.py"),
    ("reexport", {f"{BACKENDS}/__init__.py": "from .flashinfer import MacaFlashInferBackend\n"},
     "vllm_metax.v1.attention.backends.MacaFlashInferBackend", f"{BACKENDS}/flashinfer.py"),
    ("reexport-absolute-alias", {f"{BACKENDS}/__init__.py":
                                 "from vllm_metax.v1.attention.backends.flashinfer import MacaFlashInferBackend as B\n"},
     "vllm_metax.v1.attention.backends.B", f"{BACKENDS}/flashinfer.py"),
    ("module-reexport", {"vllm_metax/v1/attention/__init__.py": "from .backends import flashinfer\n"},
     "vllm_metax.v1.attention.flashinfer.MacaFlashInferBackend", f"{BACKENDS}/flashinfer.py"),
    ("nested", {f"{BACKENDS}/nested.py": "class Outer:\n    class Inner:\n        pass\n"},
     "vllm_metax.v1.attention.backends.nested.Outer.Inner", f"{BACKENDS}/nested.py"),
    ("under-try", {f"{BACKENDS}/opt.py": "try:\n    class B:\n        pass\nexcept ImportError:\n    B = None\n"},
     "vllm_metax.v1.attention.backends.opt.B", f"{BACKENDS}/opt.py"),
    # negatives
    ("missing-class", {}, "vllm_metax.v1.attention.backends.flashinfer.FlashInferBackend", None),
    ("similar-name-elsewhere", {f"{BACKENDS}/flashinfer_v2.py": "class MacaFlashInferBackendV2:\n    pass\n"},
     "vllm_metax.v1.attention.backends.flashinfer_v2.MacaFlashInferBackend", None),
    ("missing-module", {}, "vllm_metax.v1.attention.backends.mla.flashmla.MacaFlashMLABackend", None),
    ("bound-in-function", {f"{BACKENDS}/lazy.py": "def make():\n    class B:\n        pass\n    return B\n"},
     "vllm_metax.v1.attention.backends.lazy.B", None),
    ("nested-missing", {f"{BACKENDS}/nested.py": "class Outer:\n    pass\n"},
     "vllm_metax.v1.attention.backends.nested.Outer.Inner", None),
    ("broken-target", {f"{BACKENDS}/broken.py": "class B(:\n"}, "vllm_metax.v1.attention.backends.broken.B", None),
]


@pytest.mark.parametrize(("extra", "class_path", "where"), [c[1:] for c in RESOLVE_CASES],
                         ids=[c[0] for c in RESOLVE_CASES])
def test_class_path_resolution(tmp_path: Path, extra: dict[str, str], class_path: str, where: str | None) -> None:
    platform = PLATFORM_HEAD + f'register_backend(AttentionBackendEnum.X, class_path="{class_path}")\n'
    d = run(tmp_path, {**extra, "vllm_metax/platform.py": platform})
    (reg,) = d.registrations
    assert (reg.resolved, reg.resolved_path) == (where is not None, where)


def test_platform_is_read_for_registrations_even_when_narrowed_away(tmp_path: Path) -> None:
    platform = PLATFORM_HEAD + 'register_backend(AttentionBackendEnum.FLASHINFER, class_path="vllm_metax.v1.attention.backends.flashinfer.MacaFlashInferBackend")\n'
    d = run(tmp_path, {"vllm_metax/platform.py": platform}, paths=(f"{BACKENDS}/flashinfer.py",))
    assert [r.name for r in d.registrations] == ["FLASHINFER"]
    assert "vllm_metax/platform.py" in {s.path for s in d.left_out}


# ------------------------------------------------------------------ priorities and switches

PRIORITIES = """\
def _get_backend_priorities(use_mla, device_capability):
    if use_mla:
        return [
            AttentionBackendEnum.FLASHMLA,
            # AttentionBackendEnum.CUTLASS_MLA,
            AttentionBackendEnum.TRITON_MLA,  # fallback
        ]
    elif device_capability.major >= 9:
        backends = [AttentionBackendEnum.FLASHINFER]
        return backends
    else:
        return [
            # TODO: add more backends here
            AttentionBackendEnum.TRITON_ATTN,
            # AttentionBackendEnum.FLASH_ATTN,
        ]


def get_supported_vit_attn_backends():
    return [AttentionBackendEnum.TORCH_SDPA]


def _get_backend_priorities_names():
    return ["FLASHINFER"]
"""


def test_priority_lists_with_conditions_and_commented_members(tmp_path: Path) -> None:
    d = run(tmp_path, {"vllm_metax/platform.py": PRIORITIES})
    got = [(p.condition, p.members, p.commented_out, p.location.line) for p in d.priorities]
    assert got == [
        ("use_mla", ("FLASHMLA", "TRITON_MLA"), ("CUTLASS_MLA",), 3),
        ("device_capability.major >= 9", ("FLASHINFER",), (), 9),
        ("else", ("TRITON_ATTN",), ("FLASH_ATTN",), 12),
    ]
    assert all(p.location.symbol == "_get_backend_priorities" for p in d.priorities)


SWITCHES = """\
class Platform:
    @classmethod
    def check_and_update_config(cls, vllm_config):
        model_config = vllm_config.model_config
        if model_config is not None:
            model_config.disable_cascade_attn = True
        else:
            vllm_config.cache_config.block_size = 64
        vllm_config.compilation_config.use_cudagraph = False
        vllm_config.attention_config.backend = AttentionBackendEnum.FLASH_ATTN
        vllm_config.parallel_config.worker_cls = compute_worker()
        vllm_config.scheduler_config.disable_chunked_mm_input = flag
        local = True

    @classmethod
    def get_device_name(cls):
        cls.disable_everything = True
        return "maca"
"""


def test_switches_in_config_methods_with_their_conditions(tmp_path: Path) -> None:
    d = run(tmp_path, {"vllm_metax/platform.py": SWITCHES})
    got = [(s.target, s.value, s.condition, s.location.line) for s in d.switches]
    assert got == [
        ("model_config.disable_cascade_attn", "True", "model_config is not None", 6),
        ("vllm_config.cache_config.block_size", "64", "not (model_config is not None)", 8),
        ("vllm_config.compilation_config.use_cudagraph", "False", "", 9),
        ("vllm_config.attention_config.backend", "AttentionBackendEnum.FLASH_ATTN", "", 10),
        ("vllm_config.scheduler_config.disable_chunked_mm_input", "flag", "", 12),
    ]


# ------------------------------------------------------------------ callers

CALLER_CASES = [
    # (id, importer path, source, counts as a caller of ops/merge.py)
    ("absolute", f"{BACKENDS}/a.py", "from vllm_metax.v1.attention.ops.merge import merge_attn_states\n", True),
    ("relative", f"{BACKENDS}/a.py", "from ..ops.merge import merge_attn_states\n", True),
    ("from-package-import-module", f"{BACKENDS}/a.py", "from vllm_metax.v1.attention.ops import merge\n", True),
    ("relative-package-import-module", f"{BACKENDS}/a.py", "from ..ops import merge as m\n", True),
    ("import-module", "vllm_metax/models/m.py", "import vllm_metax.v1.attention.ops.merge\n", True),
    ("lazy-out-of-scope", "vllm_metax/patch/p.py",
     "def f():\n    from vllm_metax.v1.attention.ops.merge import merge_attn_states\n    return merge_attn_states\n", True),
    ("upstream-same-name", f"{BACKENDS}/a.py", "from vllm.v1.attention.ops.merge import merge_attn_states\n", False),
    ("sibling-module", f"{BACKENDS}/a.py", "from vllm_metax.v1.attention.ops.merge_v2 import merge\n", False),
    ("mentioned-only", f"{BACKENDS}/a.py", "# uses vllm_metax.v1.attention.ops.merge\nmerge = 1\n", False),
    ("relative-wrong-level", f"{BACKENDS}/a.py", "from .ops.merge import merge_attn_states\n", False),
]


@pytest.mark.parametrize(("importer", "source", "expected"), [c[1:] for c in CALLER_CASES],
                         ids=[c[0] for c in CALLER_CASES])
def test_callers(tmp_path: Path, importer: str, source: str, expected: bool) -> None:
    d = run(tmp_path, {importer: source})
    callers = d.callers["vllm_metax/v1/attention/ops/merge.py"]
    assert (importer in callers) is expected
    assert set(d.callers) == {f.path for f in d.files}


def test_package_init_callers_and_self_import(tmp_path: Path) -> None:
    d = run(tmp_path, {
        "vllm_metax/v1/attention/ops/__init__.py": "from .merge import merge_attn_states\n",
        "vllm_metax/v1/attention/ops/merge.py": "from vllm_metax.v1.attention.ops import merge\n",
        f"{BACKENDS}/a.py": "from vllm_metax.v1.attention.ops import merge_attn_states\n",
    })
    assert d.callers["vllm_metax/v1/attention/ops/merge.py"] == ("vllm_metax/v1/attention/ops/__init__.py",)
    assert d.callers["vllm_metax/v1/attention/ops/__init__.py"] == (f"{BACKENDS}/a.py", "vllm_metax/v1/attention/ops/merge.py")


# ------------------------------------------------------------------ widen


def test_widen_adds_reached_port_files(tmp_path: Path) -> None:
    d = run(tmp_path, {
        "vllm_metax/utils/__init__.py": "",
        "vllm_metax/utils/fi.py": "def wrap():\n    pass\n",
        f"{BACKENDS}/flashinfer.py": "from vllm_metax.utils.fi import wrap\n",
    }, paths=(f"{BACKENDS}/flashinfer.py", "vllm_metax/v1/attention/ops/merge.py"))
    assert "vllm_metax/utils/fi.py" not in {f.path for f in d.files}
    wide = widen(d, tmp_path, ["vllm_metax/utils/fi.py", "vllm_metax.utils", "vllm/elsewhere.py",
                               "vllm_metax/ghost.py", f"{BACKENDS}/flashinfer.py", "vllm_metax/platform.py"])
    added = {f.path: f.reason for f in wide.files if f.path not in {g.path for g in d.files}}
    assert added == {"vllm_metax/utils/fi.py": "reached-by-trace", "vllm_metax/utils/__init__.py": "reached-by-trace",
                     "vllm_metax/platform.py": "reached-by-trace"}
    assert wide.callers["vllm_metax/utils/fi.py"] == (f"{BACKENDS}/flashinfer.py",)
    assert "vllm_metax/platform.py" not in {s.path for s in wide.left_out}
    assert widen(d, tmp_path, []) is d


# ------------------------------------------------------------------ rules

def _platform(registrations: str, priorities: str = "") -> str:
    return PLATFORM_HEAD + textwrap.dedent(registrations) + textwrap.dedent(priorities)


FI = "vllm_metax.v1.attention.backends.flashinfer.MacaFlashInferBackend"
PRIO = """
def _get_backend_priorities(use_mla):
    return [
        AttentionBackendEnum.FLASHINFER,
        # AttentionBackendEnum.TRITON_ATTN,
    ]
"""

RULE_CASES = [
    # (id, platform source, expected (rule, symbol) pairs)
    ("clean", _platform(f'register_backend(AttentionBackendEnum.FLASHINFER, class_path="{FI}")\n', PRIO), []),
    ("MXA010-unresolved", _platform(
        'register_backend(AttentionBackendEnum.FLASHINFER, class_path="vllm_metax.v1.attention.backends.flashinfer.Gone")\n', PRIO),
     [("MXA010", "FLASHINFER")]),
    ("MXA011-not-prioritised", _platform(
        f'register_backend(AttentionBackendEnum.FLASHINFER, class_path="{FI}")\n'
        f'register_backend(AttentionBackendEnum.TRITON_ATTN, class_path="{FI}")\n', PRIO),
     [("MXA011", "TRITON_ATTN")]),
    ("MXA011-no-priorities-no-finding", _platform(
        f'register_backend(AttentionBackendEnum.TRITON_ATTN, class_path="{FI}")\n'), []),
    ("MXA012-unregistered-priority", _platform(
        f'register_backend(AttentionBackendEnum.FLASHINFER, class_path="{FI}")\n',
        PRIO.replace("AttentionBackendEnum.FLASHINFER,", "AttentionBackendEnum.FLASHINFER, AttentionBackendEnum.FLASH_ATTN,")),
     [("MXA012", "FLASH_ATTN")]),
    ("MXA013-duplicate", _platform(
        f'register_backend(AttentionBackendEnum.FLASHINFER, class_path="{FI}")\n'
        'register_backend(AttentionBackendEnum.FLASHINFER, class_path="vllm.v1.attention.backends.flashinfer.FlashInferBackend")\n',
        PRIO), [("MXA013", "FLASHINFER"), ("MXA014", "FLASHINFER")]),
    ("MXA013-same-path-twice", _platform(
        f'register_backend(AttentionBackendEnum.FLASHINFER, class_path="{FI}")\n' * 2, PRIO), []),
    ("MXA014-outside", _platform(
        'register_backend(AttentionBackendEnum.FLASHINFER, class_path="vllm.v1.attention.backends.flashinfer.FlashInferBackend")\n',
        PRIO), [("MXA014", "FLASHINFER")]),
    ("MXA016-not-literal", _platform(
        'register_backend(AttentionBackendEnum.FLASHINFER, class_path=PREFIX + ".MacaFlashInferBackend")\n', PRIO),
     [("MXA016", "FLASHINFER")]),
    ("MXA016-fstring", _platform(
        'register_backend(AttentionBackendEnum.FLASHINFER, class_path=f"{PKG}.MacaFlashInferBackend")\n', PRIO),
     [("MXA016", "FLASHINFER")]),
]


@pytest.mark.parametrize(("platform", "expected"), [c[1:] for c in RULE_CASES], ids=[c[0] for c in RULE_CASES])
def test_registration_rules(tmp_path: Path, platform: str, expected: list[tuple[str, str]]) -> None:
    d = run(tmp_path, {"vllm_metax/platform.py": platform})
    assert rules_of(d) == sorted(expected)
    for finding in registration_findings(d):
        assert finding.evidence and all(":" in e for e in finding.evidence[:1])


@pytest.mark.parametrize(("assignment", "flagged"), [
    ("model_config.disable_cascade_attn = True", True),
    ("model_config.use_cudagraph = False", True),
    ("model_config.disable_cascade_attn = False", False),
    ("model_config.enable_prefix_caching = True", False),
    ("model_config.block_size = 16", False),
])
def test_mxa015_switches_that_turn_features_off(tmp_path: Path, assignment: str, flagged: bool) -> None:
    source = f"def check_and_update_config(vllm_config):\n    {assignment}\n"
    d = run(tmp_path, {"vllm_metax/platform.py": source})
    assert len(d.switches) == 1
    assert [f.rule for f in registration_findings(d)] == (["MXA015"] if flagged else [])


# ------------------------------------------------------------------ the bundled demo port


def test_demo_port_discovery() -> None:
    d = discover(port_root(), CFG)
    regs = {(r.kind, r.name): r.resolved for r in d.registrations}
    assert regs == {
        ("attention-backend", "FLASHINFER"): True,
        ("attention-backend", "TRITON_ATTN"): True,
        ("attention-backend", "TRITON_MLA"): False,
        ("mla-prefill", "TRITON"): True,
        ("decorator", "CUSTOM"): True,
    }
    assert [p.commented_out for p in d.priorities] == [("FLASHMLA",), ("FLASH_ATTN",)]
    assert any(s.target.endswith("disable_cascade_attn") and s.value == "True" for s in d.switches)
    assert d.callers["vllm_metax/v1/attention/ops/merge_attn_states.py"] == (f"{BACKENDS}/flashinfer.py",)
    assert sorted(f.rule for f in registration_findings(d)) == ["MXA010", "MXA011", "MXA015"]
    assert list(coverage_findings(d)) == []


def test_custom_op_targets_and_shared_names(tmp_path: Path) -> None:
    ops = """\
    def build():
        def local_op(x):
            return x
        direct_register_custom_op(op_name="mx_local", op_func=local_op)

    def mx_op(x):
        return x

    direct_register_custom_op(op_name="mx_op", op_func=mx_op)

    @CustomOp.register("mx_op")
    class MxOp:
        pass
    """
    d = run(tmp_path, {f"{BACKENDS}/ops_layer.py": ops})
    assert [(r.name, r.class_path, r.resolved) for r in d.registrations] == [
        ("mx_local", "local_op", False),
        ("mx_op", "vllm_metax.v1.attention.backends.ops_layer.mx_op", True),
        ("mx_op", "vllm_metax.v1.attention.backends.ops_layer.MxOp", True),
    ]
    assert rules_of(d) == []
    # at module level the op function must exist in the module
    d = run(tmp_path, {f"{BACKENDS}/ops_layer.py": ops.replace("op_func=mx_op", "op_func=gone")})
    assert rules_of(d) == [("MXA010", "mx_op")]


def test_a_backend_registered_by_call_and_decorator_is_one_missing_backend(tmp_path: Path) -> None:
    # the real port registers TRITON_ATTN in platform.py and with @register_backend on its class
    d = run(tmp_path, {
        "vllm_metax/platform.py": _platform(
            f'register_backend(AttentionBackendEnum.FLASHINFER, class_path="{FI}")\n'
            'register_backend(AttentionBackendEnum.TRITON_ATTN, class_path="vllm_metax.v1.attention.backends.triton_attn.TB")\n',
            PRIO),
        f"{BACKENDS}/triton_attn.py": "from vllm.v1.attention.backends.registry import register_backend, AttentionBackendEnum\n\n\n"
                                      "@register_backend(AttentionBackendEnum.TRITON_ATTN)\nclass TB:\n    pass\n",
    })
    assert {(r.kind, r.name) for r in d.registrations} >= {("attention-backend", "TRITON_ATTN"), ("decorator", "TRITON_ATTN")}
    found = [f for f in registration_findings(d) if f.rule == "MXA011"]
    assert len(found) == 1
    assert found[0].location.path == "vllm_metax/platform.py"  # led by the platform's call
    assert [e.split(": registers")[0].split(":")[0] for e in found[0].evidence[:2]] == ["vllm_metax/platform.py", f"{BACKENDS}/triton_attn.py"]
