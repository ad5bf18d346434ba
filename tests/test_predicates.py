# Helper predicates evaluated over the vendor platform (compare/predicates.py): a condition that differs in text
# but reads the same on the vendor platform once each side's helpers are followed is info with the evaluation as
# evidence; what the facts do not decide stays unknown (and the difference keeps its weight).
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import write_tree

from metax_audit.core.findings import make_finding
from metax_audit.core.models import Location, Severity, Site
from metax_audit.stages.compare.consequence import read_vendor_platform
from metax_audit.stages.compare.grouping import hunk_line
from metax_audit.stages.compare.predicates import Capability, Evaluator, platform_capability, same_on_platform
from metax_audit.stages.triage import triage

# A made-up upstream: a helper module whose answer depends on the device, and a backend using it.
UPSTREAM = {
    "up/__init__.py": "",
    "up/helpers.py": (
        "from up.platforms import current_platform\n"
        "def forced():\n    return get_config().forced\n\n"
        "def fast_path_ok(is_prefill=False):\n"
        "    if not reachable():\n        return False\n"
        "    if current_platform.is_device_capability(90):\n        return not is_prefill\n"
        "    return current_platform.is_device_capability_family(100)\n\n"
        "def can_use_fast(a, b, is_prefill=False):\n"
        "    if forced() is False:\n        return False\n"
        "    return fast_path_ok(is_prefill=is_prefill) and a % b == 0\n"
    ),
    "up/backend.py": (
        "from up.platforms import current_platform\n"
        "class Backend:\n"
        "    @classmethod\n    def supports_extra(cls):\n"
        "        from up.helpers import forced\n"
        "        if forced() is False:\n            return False\n"
        "        if not current_platform.is_device_capability_family(100):\n            return False\n"
        "        return True\n\n"
        "class Builder:\n"
        "    def __init__(self, n):\n"
        "        self.extra = n > 1\n"
        "        if self.extra and not Backend.supports_extra():\n            raise NotImplementedError('no extra')\n"
        "        self.n = n\n"
    ),
}
PORT = {
    "port/__init__.py": "",
    "port/platform.py": (
        "class VendorPlatform(Platform):\n    _enum = PlatformEnum.OOT\n\n"
        "    @classmethod\n    def get_device_capability(cls, device_id=0):\n        return query_device(device_id)\n\n"
        "    @classmethod\n    def is_device_capability_family(cls, capability, device_id=0):\n        return False\n"
    ),
    "port/backend.py": (
        "from up.helpers import can_use_fast\n"
        "class Builder:\n"
        "    def __init__(self, n):\n"
        "        fast = can_use_fast(n, 1)\n"
        "        self.extra = n > 1\n"
        "        if self.extra and not fast:\n            raise NotImplementedError('no extra')\n"
        "        self.n = n\n"
    ),
}
# Line of the `if` in each backend.
PORT_IF, UP_IF = 6, 15


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    write_tree(tmp_path / "up", UPSTREAM)
    write_tree(tmp_path / "port", PORT)
    return tmp_path / "port", tmp_path / "up"


def _evaluator(roots: tuple[Path, Path], capability: str) -> Evaluator:
    port, up = roots
    return Evaluator(read_vendor_platform(port, "port/platform.py"), Capability.parse(capability, "config device-capability"),
                     {"up": up, "port": port})


@pytest.mark.parametrize(("capability", "same"), [
    ("8.0", True),  # neither helper can answer True off SM90/SM100: both conditions read `self.extra and True`
    ("9.0", False),  # the port's helper says yes on SM90 for decode, upstream's does not: a real difference
    ("", False),  # unknown capability: the port's side is unknown, so it stays unknown
    ("none", True),  # the platform reports no capability: every capability question is False
])
def test_a_condition_is_the_same_on_the_vendor_platform_only_when_the_facts_decide_it(
        roots: tuple[Path, Path], capability: str, same: bool) -> None:
    port, up = roots
    got = same_on_platform(_evaluator(roots, capability), port, "port/backend.py", PORT_IF, up, "up/backend.py", UP_IF)
    assert bool(got) == same
    if same:
        assert "both read `if self.extra and True:`" in got
        assert "Backend.supports_extra() returns False on every path there (up/backend.py:" in got
        assert "can_use_fast() returns False on every path there (up/helpers.py:" in got
        assert "port/platform.py:" in got  # the platform class's own answer is evidence


def test_a_statement_that_differs_past_its_condition_is_not_the_same(roots: tuple[Path, Path]) -> None:
    port, up = roots
    (port / "port/backend.py").write_text(PORT["port/backend.py"].replace("raise NotImplementedError('no extra')",
                                                                           "self.n = 0"))
    assert same_on_platform(_evaluator(roots, "8.0"), port, "port/backend.py", PORT_IF, up, "up/backend.py", UP_IF) == ""


def test_the_platform_class_answering_no_capability_is_read(tmp_path: Path) -> None:
    write_tree(tmp_path, {"p/platform.py": "class P(Platform):\n    def get_device_capability(cls, device_id=0):\n        return None\n"})
    cap = platform_capability(tmp_path / "p/platform.py", "p/platform.py")
    assert cap.known and cap.value is None and "P.get_device_capability returns None" in cap.source
    assert not platform_capability(tmp_path / "port/platform.py", "x").known  # no file: unknown


def test_triage_demotes_a_hunk_the_platform_makes_the_same(roots: tuple[Path, Path]) -> None:
    port, up = roots
    hunk = Site("port/backend.py", PORT_IF, "Builder.__init__", "changed", "differs at ...",
                upstream=f"up/backend.py:{UP_IF}")
    f = make_finding("MXA201", Location("port/backend.py", PORT_IF, "Builder.__init__"), "changed in Builder.__init__",
                     [hunk_line(hunk)], sites=[hunk])
    for capability, severity in (("8.0", Severity.INFO), ("9.0", Severity.WARNING)):
        (got,) = triage([f], [], None, platform=_evaluator(roots, capability), roots=(port, up))
        assert got.severity is severity
        assert got.sites[0].verdict.startswith("info: the same on the vendor platform") == (severity is Severity.INFO)


def test_dropped_registrations_of_an_imported_upstream_module_are_upstreams(tmp_path: Path) -> None:
    from metax_audit.stages.compare.predicates import registered_by_imported_upstream

    up = write_tree(tmp_path / "up", {"up/layer.py": (
        "def kv_update(x):\n    return x\n\ndirect_register_custom_op(op_name='kv_update', op_func=kv_update)\n\n"
        "def attend(x):\n    return x\n\ndirect_register_custom_op(op_name='attend', op_func=attend)\n")})
    importing = "from typing import TYPE_CHECKING\nfrom up.layer import kv_update\n\nif TYPE_CHECKING:\n    pass\n"
    port = write_tree(tmp_path / "port", {"port/layer.py": importing, "port/other.py": importing.replace("from up.layer", "from up.ops")})
    got = registered_by_imported_upstream(port, "port/layer.py", 4, up, "up/layer.py", 4)
    assert "registers kv_update, attend when it is imported" in got and "imports from that module (line 2)" in got
    assert registered_by_imported_upstream(port, "port/other.py", 4, up, "up/layer.py", 4) == ""  # not imported: gone
    write_tree(port, {"port/layer.py": importing.replace("    pass\n", "    pass\nX = build()\n")})
    assert registered_by_imported_upstream(port, "port/layer.py", 6, up, "up/layer.py", 4) == ""  # replaced by real code


def test_a_dropped_branch_for_a_feature_the_backend_does_not_support_there(tmp_path: Path) -> None:
    from metax_audit.stages.compare.predicates import unsupported_feature_branch

    up = write_tree(tmp_path / "up", {**UPSTREAM, "up/impl.py": (
        "class Impl:\n    def __init__(self, sinks=None):\n        self.sinks = None\n"
        "        if sinks is not None:\n            self.sinks = sinks\n")})
    backend = ("from up.helpers import fast_path_ok\nclass VendorBackend:\n    @classmethod\n    def supports_sink(cls):\n"
               "        return fast_path_ok()\n\nclass Impl:\n    def __init__(self, sinks=None):\n        self.sinks = None\n")
    port = write_tree(tmp_path / "port", {**PORT, "port/impl.py": backend})
    for capability, said in (("8.0", True), ("9.0", False)):
        ev = Evaluator(read_vendor_platform(port, "port/platform.py"), Capability.parse(capability, "config"), {"up": up, "port": port})
        got = unsupported_feature_branch(ev, port, "port/impl.py", up, "up/impl.py", 4)
        assert bool(got) == said, got
        if said:
            assert "VendorBackend.supports_sink() says the backend does not support" in got


def test_a_value_whose_truth_alone_is_known_is_folded_only_where_truth_counts(roots: tuple[Path, Path]) -> None:
    # `unknown_value and fast_path_ok()` is falsy on the platform, but its value may be 0, None or False: a condition
    # folds it, an assignment does not (two sides storing different falsy values are not the same code)
    import ast

    from metax_audit.stages.compare.predicates import fold

    _port, up = roots
    ev = _evaluator(roots, "8.0")
    mod = ev.module_at(up, "up/helpers.py")
    assert mod is not None
    scope = ev.scope_in(mod, None, None)
    expr = ast.parse("limit() and fast_path_ok()", mode="eval").body
    assert ast.unparse(fold(expr, ev, scope, [], truth=True)) == "False"
    assert ast.unparse(fold(expr, ev, scope, [])) == "limit() and False"
