# The port's version tests (config version-tests) decided for the upstream release under review.
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from metax_audit.core.config import load_config
from metax_audit.core.errors import ConfigError
from metax_audit.core.versions import branch_taken, evaluate, release


@pytest.mark.parametrize(("text", "want"), [("0.14.0", (0, 14, 0)), ("v0.14", (0, 14, 0)), ("1", (1, 0, 0)),
                                            ("0.11.0rc3", None), ("0.14.0+cpu", None), ("0.14.0.post1", None), ("", None)])
def test_release(text: str, want: tuple[int, ...] | None) -> None:
    assert release(text) == want


TESTS = {"is_": "==", "at_least": ">=", "before": "<"}


@pytest.mark.parametrize(("cond", "version", "want"), [
    ("is_('0.14.0')", "0.14.0", True),
    ("is_('0.14')", "0.14.0", True),
    ("is_('0.13.0')", "0.14.0", False),
    ("mod.is_('0.13.0')", "0.14.0", False),
    ("not is_('0.13.0')", "0.14.0", True),
    ("at_least('0.14.1')", "0.14.0", False),
    ("before('0.15')", "0.14.1", True),
    ("is_('0.13.0') or is_('0.14.0')", "0.14.0", True),
    ("is_('0.13.0') and other()", "0.14.0", False),
    ("is_('0.14.0') and other()", "0.14.0", None),
    ("is_(v)", "0.14.0", None),
    ("is_('0.14.0', strict=True)", "0.14.0", None),
    ("unknown('0.14.0')", "0.14.0", None),
    ("is_('0.14.0')", "0.14.0rc1", None),
])
def test_evaluate(cond: str, version: str, want: bool | None) -> None:
    assert evaluate(ast.parse(cond, mode="eval").body, TESTS, version) is want


def test_branch_taken_reads_the_guard_text() -> None:
    assert branch_taken("if is_('0.13.0')", TESTS, "0.14.0") is False
    assert branch_taken("if not (is_('0.13.0'))", TESTS, "0.14.0") is True
    assert branch_taken("except ImportError: pass", TESTS, "0.14.0") is None
    assert branch_taken("if is_('0.13.0')", {}, "0.14.0") is None


def test_config_key(tmp_path: Path) -> None:
    (tmp_path / ".metax-audit.yaml").write_text("port-package: port\nversion-tests:\n  up_version_is: '=='\n")
    assert load_config(tmp_path).version_tests == {"up_version_is": "=="}
    (tmp_path / ".metax-audit.yaml").write_text("port-package: port\nversion-tests:\n  up_version_is: 'equals'\n")
    with pytest.raises(ConfigError, match="version-tests"):
        load_config(tmp_path)
    (tmp_path / ".metax-audit.yaml").write_text("port-package: port\nversion-tests: [up_version_is]\n")
    with pytest.raises(ConfigError, match="version-tests"):
        load_config(tmp_path)
