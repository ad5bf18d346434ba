# Calls into a kernel package's compiled module (MXA112): the package's own calls of the same function are
# the contract; a port call with another arity or an unknown keyword is an error, a matching one is silent.
from __future__ import annotations

from pathlib import Path

import pytest

from metax_audit.core.models import CallableFact, Discovery, SourceFile, StackFacts
from metax_audit.stages.checks.compiled_calls import check_compiled_calls, package_roots

KERNEL = '''
class DecodeWrapper:
    def plan(self, indptr, heads, tensor_cores=False):
        if tensor_cores:
            self._cached_module = get_prefill_module(1)
            self._plan_info = self._cached_module.plan(self._ws, indptr, heads, 1, False)
        else:
            self._cached_module = get_decode_module(2)
            self._plan_info = self._cached_module.plan(self._ws, indptr, heads)

    def run(self, q):
        get_decode_module(2).run(q, self._plan_info, out=None)
'''


def _setup(tmp_path: Path, port_call: str) -> tuple[Discovery, StackFacts]:
    pkg = tmp_path / "site" / "kern"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from kern.decode import DecodeWrapper\n")
    (pkg / "decode.py").write_text(KERNEL)
    port = tmp_path / "repo" / "port"
    port.mkdir(parents=True)
    (port / "__init__.py").write_text("")
    (port / "attn.py").write_text(f"import kern\n\ndef fast_plan(self, indptr, heads, stream):\n    {port_call}\n")
    fact = CallableFact("kern.DecodeWrapper", "ok", "import", sourcefile=str(pkg / "decode.py"), distribution="kern", version="1.0")
    facts = StackFacts("py", "", "", {"kern.DecodeWrapper": fact})
    return Discovery(tmp_path / "repo", "port", (SourceFile("port/attn.py", "port.attn", "glob"),), (), (), (), {}), facts


@pytest.mark.parametrize(("call", "problem"), [
    ("self._cached_module.plan(self._ws, indptr, heads, 1, False)", None),  # the tensor-core form
    ("self._cached_module.plan(self._ws, indptr, heads)", None),  # the other form
    ("self._cached_module.plan(self._ws, indptr, heads, 1, False, stream)", "passes 6 positional argument(s)"),
    ("get_decode_module(2).run(q, info, out=None)", None),
    ("get_decode_module(2).run(q, info, out=None, stream=stream)", "passes keyword(s) stream"),
    ("self._cached_module.plan(*args)", None),  # the count is not known: not checked
    ("self._other_module.plan(1)", None),  # the package never calls it: no contract
])
def test_compiled_call_binds_against_the_packages_own_calls(tmp_path: Path, call: str, problem: str | None) -> None:
    d, facts = _setup(tmp_path, call)
    found = list(check_compiled_calls(d, facts))
    assert [f.rule for f in found] == (["MXA112"] if problem else []), [f.message for f in found]
    if problem:
        assert problem in found[0].message and found[0].severity.value == "error"
        ev = "\n".join(found[0].evidence)
        assert ev.startswith("port: port/attn.py:4:") and "kern 1.0: " in ev and "decode.py:" in ev


def test_no_readable_package_no_check(tmp_path: Path) -> None:
    d, facts = _setup(tmp_path, "self._cached_module.plan(1)")
    manifest = StackFacts("py", "", "", facts.facts, source="manifest:m.json")
    assert package_roots(manifest) == {} and list(check_compiled_calls(d, manifest)) == []
