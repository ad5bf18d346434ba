# Discover's findings: files not parsed (MXA001/MXA002), registrations that do not resolve, are
# not literal or are duplicated, priority lists, config switches (MXA010-MXA017).
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from metax_audit.core.findings import make_finding, rule
from metax_audit.core.models import Category, Discovery, Finding, Location, Registration, Severity
from metax_audit.core.pysource import EXPR_DEPTH_LIMIT, cached_parse, find_module, too_deep_lines
from metax_audit.stages.discover.platform import _SWITCH_ATTR
from metax_audit.stages.discover.registrations import _DOTTED

# ------------------------------------------------------------------ rules


rule(
    "MXA010", Category.REGISTRATION, Severity.ERROR,
    "registration names a class path that does not resolve in the snapshot",
    "The registered module or class does not exist in the audited snapshot, so selecting this backend "
    "fails at runtime with an import error. Fix the class path or add the class.",
)
rule(
    "MXA011", Category.REGISTRATION, Severity.INFO,
    "registered attention backend is in no priority list of the platform",
    "The backend is only used when selected explicitly (--attention-backend); automatic selection never "
    "picks it. Commented-out priority entries are listed in the evidence. Add it to the priorities or waive.",
)
rule(
    "MXA012", Category.REGISTRATION, Severity.WARNING,
    "priority list names a backend the port does not register",
    "Automatic selection can pick this enum member, but the port registers no class for it, so the "
    "upstream (NVIDIA) class is loaded on the vendor platform. Register the port's class or remove the entry.",
)
rule(
    "MXA013", Category.REGISTRATION, Severity.WARNING,
    "the same backend is registered more than once with different class paths",
    "The last registration executed wins, which depends on import order. Keep one registration.",
)
rule(
    "MXA014", Category.REGISTRATION, Severity.INFO,
    "registration points outside the audited snapshot",
    "The class path names a package that is not part of the snapshot (typically upstream), so it cannot "
    "be checked here; the upstream class runs unchanged on the vendor platform.",
)
rule(
    "MXA015", Category.INACTIVE_PATH, Severity.INFO,
    "the platform turns a feature off in the config",
    "A config switch set by the platform disables (or forces) a feature, so the matching branches in the "
    "backends are inactive on this platform. They are still audited; probes of them cannot run end to end.",
)
rule(
    "MXA017", Category.REGISTRATION, Severity.WARNING,
    "decorator registration passes a class_path that is not a class path",
    "Given a class_path, vLLM's register_backend records that string for the enum member and returns a "
    "no-op decorator, so the decorated class is not registered and selecting the member imports the string. "
    "Info when the platform selects its backends by returning class paths (the registry entry is then unused).",
)
rule(
    "MXA016", Category.REGISTRATION, Severity.WARNING,
    "registration whose backend or class path is not a literal",
    "The class path (or enum member) is computed at runtime, so the audit cannot tell which class is "
    "registered. Write it as a string literal (and an enum attribute) so it can be checked.",
)


def coverage_findings(discovery: Discovery) -> Iterator[Finding]:
    """MXA001 for files in scope that could not be parsed, MXA002 for files skipped by size."""
    for f in discovery.files:
        problem = f.problem
        if problem is None:
            for line in _too_deep(discovery.root, f.path):
                yield make_finding("MXA002", Location(f.path, line, f.module), f"expression too deep to analyse at {f.path}:{line}",
                                   (f"{f.path}:{line}: an expression nests more than {EXPR_DEPTH_LIMIT} levels deep; what lies "
                                    "below that depth was not traced, compared or checked",), key=f"too-deep:{line}")
            continue
        if not problem.broken:
            yield make_finding("MXA002", Location(f.path, 0, f.module), f"{f.path} was not analysed: {problem.message}",
                               (f"{f.path}: {problem.message}", "discover: files over max_file_bytes are not parsed"))
            continue
        line = problem.line
        yield make_finding("MXA001", Location(f.path, line, f.module), f"{f.path} could not be parsed: {problem.message}",
                           (f"{f.path}:{line}: {problem.message}" if line else f"{f.path}: {problem.message}",))


def _too_deep(root: Path, rel: str) -> tuple[int, ...]:
    """The lines where the parse cut an expression of this file as too deep (pysource.prune_deep)."""
    try:
        return too_deep_lines(cached_parse(root / rel)[1])
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return ()


def registration_findings(discovery: Discovery) -> Iterator[Finding]:
    """Findings about what the port registers and how the platform orders and switches it."""
    packages = _snapshot_packages(discovery.root)
    selectors = sorted({r.selected_by for r in discovery.registrations if r.selected_by})
    for reg in discovery.registrations:
        where = f"{reg.location.path}:{reg.location.line}"
        literal = _DOTTED.match(reg.class_path) is not None
        if reg.kind == "custom-op" and not literal:
            continue  # an op function bound inside a function or computed: nothing to resolve statically
        if reg.kind == "decorator" and reg.literal and not literal:
            yield make_finding(
                "MXA017", reg.location,
                f"@register_backend({reg.name}, {reg.class_path!r}) registers the string {reg.class_path!r} for {reg.name},"
                " not the decorated class",
                (f"{where}: class_path={reg.class_path!r} is not a dotted class path",
                 "vLLM's register_backend with a class_path stores it and returns a no-op decorator",
                 *([f"the platform selects backends by returning class paths from {', '.join(selectors)}, "
                    "so selection does not read this entry"] if selectors else [])),
                severity=Severity.INFO if selectors else None)
        elif not literal or not reg.name.replace("_", "").isalnum():
            yield make_finding("MXA016", reg.location, f"{reg.kind} registration of {reg.name!r} is not a literal",
                               (f"{where}: class path {reg.class_path!r}",))
        elif not reg.resolved and reg.class_path.split(".")[0] in packages:
            yield make_finding("MXA010", reg.location,
                               f"{reg.kind} {reg.name} is registered to {reg.class_path}, which does not exist in the snapshot",
                               (f"{where}: class_path={reg.class_path!r}", _missing_part(discovery.root, reg.class_path)))
        elif not reg.resolved:
            yield make_finding("MXA014", reg.location,
                               f"{reg.kind} {reg.name} is registered to {reg.class_path}, outside the snapshot",
                               (f"{where}: class_path={reg.class_path!r}",
                                f"packages in the snapshot: {', '.join(sorted(packages)) or 'none'}"))
    yield from _duplicate_findings(discovery)
    yield from _priority_findings(discovery)
    for sw in discovery.switches:
        name = sw.target.rsplit(".", 1)[-1]
        turned_off = (name.startswith("disable_") and sw.value == "True") or (
            _SWITCH_ATTR.match(name) is not None and not name.startswith("disable_") and sw.value == "False")
        if turned_off:
            cond = f" when {sw.condition}" if sw.condition else ""
            yield make_finding("MXA015", sw.location, f"the platform sets {sw.target} = {sw.value}{cond}",
                               (f"{sw.location.path}:{sw.location.line}: {sw.target} = {sw.value}"
                                f" in {sw.location.symbol}" + (f" under `{sw.condition}`" if sw.condition else ""),))


def _backend_kinds() -> set[str]:
    return {"attention-backend", "decorator"}


def _duplicate_findings(discovery: Discovery) -> Iterator[Finding]:
    seen: dict[tuple[str, str], Registration] = {}
    for reg in discovery.registrations:
        if reg.kind == "custom-op":
            continue  # torch ops and CustomOp classes share names across separate registries
        kind = "attention" if reg.kind in _backend_kinds() else reg.kind
        first = seen.setdefault((kind, reg.name), reg)
        if first is not reg and first.class_path != reg.class_path:
            yield make_finding("MXA013", reg.location,
                               f"{reg.name} is registered again, to {reg.class_path} (first: {first.class_path})",
                               (f"{first.location.path}:{first.location.line}: {first.class_path}",
                                f"{reg.location.path}:{reg.location.line}: {reg.class_path}"))


def _priority_findings(discovery: Discovery) -> Iterator[Finding]:
    if not discovery.priorities:
        return
    listed = {m for p in discovery.priorities for m in p.members}
    commented = {m: p for p in discovery.priorities for m in p.commented_out}
    backend_regs = [r for r in discovery.registrations if r.kind in _backend_kinds()]
    # One finding per backend: a backend registered by a platform call and by its class's decorator
    # is one backend missing from the lists, not two (led by the platform's call when there is one).
    by_name: dict[str, list[Registration]] = {}
    for reg in backend_regs:
        if reg.name not in listed and not reg.selected_by:
            by_name.setdefault(reg.name, []).append(reg)
    for regs in by_name.values():
        reg = next((r for r in regs if r.kind != "decorator"), regs[0])
        evidence = [f"{r.location.path}:{r.location.line}: registers {r.name} -> {r.class_path}" for r in [reg, *(r for r in regs if r is not reg)]]
        evidence += [f"{p.location.path}:{p.location.line}: priorities ({p.condition or 'always'}): "
                     f"{', '.join(p.members) or 'empty'}" for p in discovery.priorities]
        if reg.name in commented:
            p = commented[reg.name]
            evidence.append(f"{p.location.path}:{p.location.line}: {reg.name} is commented out of this list")
        yield make_finding("MXA011", reg.location, f"registered backend {reg.name} is in no priority list", evidence)
    registered = {r.name for r in backend_regs}
    for p in discovery.priorities:
        for member in p.members:
            if member not in registered:
                yield make_finding(
                    "MXA012", Location(p.location.path, p.location.line, member),
                    f"priority list ({p.condition or 'always'}) names {member}, which the port does not register",
                    (f"{p.location.path}:{p.location.line}: {', '.join(p.members)}",
                     f"registered: {', '.join(sorted(registered)) or 'none'}"))


def _snapshot_packages(root: Path) -> set[str]:
    try:
        return {p.name if p.is_dir() else p.stem for p in root.iterdir()
                if (p.is_dir() and p.name.isidentifier()) or (p.suffix == ".py" and p.stem.isidentifier())}
    except OSError:
        return set()


def _missing_part(root: Path, class_path: str) -> str:
    parts = class_path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        mod = ".".join(parts[:cut])
        rel = find_module(root, mod)
        if rel is not None:
            rest = parts[cut:]
            if len(rest) > 1 and not rel.endswith("__init__.py"):
                return f"module {mod} exists ({rel}) but defines no {'.'.join(rest)}"
            if len(rest) > 1:
                return f"package {mod} exists ({rel}) but has no module {mod}.{rest[0]}"
            return f"module {mod} exists ({rel}) but defines no {rest[0]}"
    return f"no module of {class_path} exists in the snapshot (looked for {parts[0]}/...)"

