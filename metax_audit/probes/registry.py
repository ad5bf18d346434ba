# Discovers probes and families: every module of `probes` and `metax_audit.probes.families` that defines
# module-level PROBES / FAMILIES tuples (so a new file such as metax_audit/probes/h2o.py joins by existing).
from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from metax_audit.probes.base import FamilySpec, ProbeContext, ProbeSpec, Target, inspect_controls

# Modules that hold machinery, not probes: skipped by discovery to keep imports cheap.
_NOT_PROBES = {"vllm_ops", "dcp_ranks", "base", "registry", "reference", "wrong_variants", "device", "runner", "report", "__main__"}


@dataclass
class Registry:
    probes: dict[str, ProbeSpec] = field(default_factory=dict)
    families: dict[str, FamilySpec] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)  # module -> import error, kept as data


_CACHE: Registry | None = None


def registry() -> Registry:
    """Import every probe/family module once; a module that fails to import is recorded, not fatal."""
    global _CACHE
    if _CACHE is not None:
        return _CACHE
    reg = Registry()
    import metax_audit.probes
    import metax_audit.probes.families

    for pkg in (metax_audit.probes, metax_audit.probes.families):
        for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
            if info.name in _NOT_PROBES or info.name.startswith("_") or info.ispkg:
                continue
            name = f"{pkg.__name__}.{info.name}"
            try:
                mod = importlib.import_module(name)
            except Exception as exc:  # a broken optional module must not hide the others
                reg.broken[name] = f"{type(exc).__name__}: {exc}"
                continue
            for spec in getattr(mod, "PROBES", ()):
                reg.probes[spec.name] = spec
            for spec in getattr(mod, "FAMILIES", ()):
                reg.families[spec.name] = spec
    _CACHE = reg
    return reg


def load_target(spec: str, family: str, ctx: ProbeContext) -> Target:
    """A family's built-in target by name, or any `MOD:CALLABLE` following the convention.

    `MOD:CALLABLE` may name a function, or a zero-argument factory when written `MOD:NAME()`
    (for targets that need construction, e.g. a class holding workspaces)."""
    fam = registry().families.get(family)
    if fam is None:
        raise KeyError(f"unknown family {family!r}; known: {sorted(registry().families)}")
    if spec in fam.builtin_targets:
        return fam.load(spec, ctx)
    if ":" not in spec:
        raise KeyError(f"target {spec!r} is neither a built-in target of {family} ({', '.join(fam.builtin_targets)}) nor MOD:CALLABLE")
    obj = resolve_callable(spec)
    return wrap_callable(spec, family, obj, fam.controls)


def resolve_callable(spec: str) -> Callable[..., Any]:
    mod_name, _, attr = spec.partition(":")
    factory = attr.endswith("()")
    attr = attr.removesuffix("()")
    if mod_name.endswith(".py"):  # a file path: import it under a private name
        from importlib import util as import_util

        s = import_util.spec_from_file_location(f"_probe_target_{abs(hash(mod_name))}", mod_name)
        if s is None or s.loader is None:
            raise ImportError(f"cannot load {mod_name}")
        mod: Any = import_util.module_from_spec(s)
        sys.modules[s.name] = mod
        s.loader.exec_module(mod)
    else:
        mod = importlib.import_module(mod_name)
    obj: Any = mod
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj() if factory else obj


def wrap_callable(name: str, family: str, obj: Any, controls: tuple[str, ...]) -> Target:
    """A user callable as a Target: controls from its signature, declarations from
    `__probe_declares__`, two-phase entry points from `plan`/`run` attributes."""
    sig, accepted = inspect_controls(obj, controls)
    plan = getattr(obj, "plan", None)
    run = getattr(obj, "run", None)
    declares = dict(getattr(obj, "__probe_declares__", {}) or {})
    return Target(
        name=name, family=family, fn=obj, signature=sig, controls=accepted, declares=declares,
        plan=plan if callable(plan) else None, run=run if callable(run) else None,
    )
