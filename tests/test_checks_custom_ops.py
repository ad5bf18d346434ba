# Custom ops (MXA175): the registered function, its fake and every torch.ops call must agree.
from __future__ import annotations

from pathlib import Path

import pytest

from metax_audit.core.models import Discovery, SourceFile
from metax_audit.stages.checks import _registering_files
from metax_audit.stages.checks.custom_ops import check_custom_ops

OPS = '''
import torch
from vllm.utils.torch_utils import direct_register_custom_op

def attn_op(q, k, scale: float, causal: bool = True):
    return q

def attn_op_fake(q, k, scale: float, causal: bool = True):
    return q

def bad_op(q, k, out):
    return q

def bad_op_fake(q, k):
    return q

def renamed_op(q, k):
    return q

def renamed_op_fake(query, key):
    return query

direct_register_custom_op(op_name="attn_op", op_func=attn_op, fake_impl=attn_op_fake)
direct_register_custom_op("bad_op", bad_op, ["out"], bad_op_fake)
direct_register_custom_op("renamed_op", renamed_op, fake_impl=renamed_op_fake)  # renamed positionals bind alike

@torch.library.custom_op("port_ns::decorated", mutates_args=())
def decorated(x, n: int):
    return x

@decorated.register_fake
def _(x, n: int):
    return x
'''


def _run(tmp_path: Path, call: str, ops: str = OPS) -> list:
    port = tmp_path / "port"
    port.mkdir(parents=True, exist_ok=True)
    (port / "__init__.py").write_text("")
    (port / "ops.py").write_text(ops)
    (port / "attn.py").write_text(f"import torch\n\ndef forward(q, k, x):\n    return {call}\n")
    d = Discovery(tmp_path, "port", (SourceFile("port/attn.py", "port.attn", "glob"),), (), (), (), {})
    return list(check_custom_ops(d, _registering_files(d), []))


def test_fake_that_takes_other_parameters(tmp_path: Path) -> None:
    assert _run(tmp_path, "None") == []  # registered outside the scope and never called from it: not attention code
    [f] = _run(tmp_path, "torch.ops.vllm.bad_op(q, k, x)")
    assert f.rule == "MXA175" and f.location.path == "port/ops.py" and "vllm::bad_op" in f.message
    assert "the fake takes 2 parameter(s) (q, k) where the op function takes 3 (q, k, out)" in f.message
    ev = "\n".join(f.evidence)
    assert "registration: port/ops.py:" in ev and "def bad_op(q, k, out)" in ev and "def bad_op_fake(q, k)" in ev


@pytest.mark.parametrize(("call", "problem"), [
    ("torch.ops.vllm.attn_op(q, k, 0.5)", None),
    ("torch.ops.vllm.renamed_op(q, k)", None),
    ("torch.ops.vllm.attn_op.default(q, k, scale=0.5, causal=False)", None),
    ("torch.ops.vllm.attn_op(q, k, 0.5, True, None)", "5 positional argument(s), the op takes 4"),
    ("torch.ops.vllm.attn_op(q, k, softmax_scale=0.5)", "keyword(s) softmax_scale the op does not have"),
    ("torch.ops.vllm.attn_op(q, k)", "required parameter(s) scale not passed"),
    ("torch.ops.port_ns.decorated(x, 2)", None),
    ("torch.ops.port_ns.decorated(x, n=2, m=3)", "keyword(s) m"),
    ("torch.ops.vllm.attn_op(*args)", None),  # not knowable
    ("torch.ops.other.attn_op(q)", None),  # another namespace's op
])
def test_calls_bind_against_the_ops_function(tmp_path: Path, call: str, problem: str | None) -> None:
    found = [f for f in _run(tmp_path, call) if f.location.path == "port/attn.py"]
    assert [f.rule for f in found] == (["MXA175"] if problem else []), [f.message for f in found]
    if problem:
        assert problem in found[0].message and found[0].severity.value == "error"
        assert found[0].evidence[0].startswith("port: port/attn.py:4:")
        assert any(e.startswith("op function (the schema is inferred from it): port/ops.py:") for e in found[0].evidence)
