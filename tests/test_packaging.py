# What the wheel installs: one top-level package, metax_audit; the probes are metax_audit.probes, so
# no `probes` of another distribution can shadow them (or be shadowed by them) in site-packages.
from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _packages() -> list[str]:
    """The packages setuptools puts in the wheel, found as the build finds them (pyproject's include)."""
    from setuptools import find_packages

    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    return find_packages(where=str(REPO), include=include)


def test_the_wheel_has_one_top_level_package_and_the_probes_live_under_it() -> None:
    packages = _packages()
    assert {p.split(".")[0] for p in packages} == {"metax_audit"}
    assert {"metax_audit.probes", "metax_audit.probes.families"} <= set(packages)
    assert not (REPO / "probes").exists()


def test_the_probe_worker_is_started_by_its_namespaced_name() -> None:
    from metax_audit.stages.probing.run import _Worker

    worker = _Worker("python3", "torch-reference", "paged-decode", "cpu", {}, 1.0, strict=False)
    assert worker._args[:2] == ["-m", "metax_audit.probes"]
