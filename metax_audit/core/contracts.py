# Kernel contracts from component-contracts.md: conventions (what a kernel returns or expects)
# and versioned observations, parsed from fenced yaml blocks and rechecked by rerunning probes.
from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metax_audit.core import inputs
from metax_audit.core.errors import AuditError
from metax_audit.core.findings import make_finding, rule
from metax_audit.core.models import Category, Finding, Location, ProbeResult, Severity

CONTRACTS_FILE = "component-contracts.md"


class ContractError(AuditError):
    """component-contracts.md could not be read: a yaml block is malformed (file:line says where)."""


LSE_BASES = ("2", "e", "param-dependent", "none")
LSE_LAYOUTS = ("[tokens, heads]", "[heads, tokens]", "none")
FLAG_EFFECTS = ("2", "e", "lse", "no-lse")
OBS_RESULTS = ("confirmed", "contradicted", "unverified")


@dataclass(frozen=True)
class Flag:
    """A keyword that changes the convention: enables the LSE or selects its base."""

    name: str
    default: bool
    when_true: str
    when_false: str
    aliases: tuple[str, ...] = ()  # other spellings of the same switch (forks rename them)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    def effect(self, value: bool) -> str:
        return self.when_true if value else self.when_false


@dataclass(frozen=True)
class Convention:
    components: tuple[str, ...]
    role: str  # "producer" | "consumer"
    lse_base: str
    lse_layout: str
    location: Location
    flag: Flag | None = None
    lse_result: int | None = None  # producer: index of the LSE in the returned tuple
    lse_out_param: str | None = None  # producer: keyword of a preallocated LSE buffer
    lse_out_position: int | None = None  # producer: position of that buffer when passed positionally
    lse_params: dict[str, int] = field(default_factory=dict)  # consumer: name -> position
    returns_lse: dict[str, Any] | None = None  # consumer: {"flag": name?, "index": i}
    output_lse_param: str | None = None
    scale_params: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {position, form: float|tensor}
    kv_layout: str = ""
    scale_form: str = ""
    probe_family: str | None = None
    probe_target: str | None = None
    note: str = ""

    def matches(self, callee: str) -> bool:
        return any(pattern_matches(p, callee) for p in self.components)


@dataclass(frozen=True)
class ProbeRef:
    name: str
    family: str
    target: str

    def __str__(self) -> str:
        return f"{self.name} ({self.family}) on {self.target}"


@dataclass(frozen=True)
class Observation:
    id: str
    component: str
    version: str  # "dist==X.Y" as written
    device: str
    date: str
    claim: str
    probe: ProbeRef
    result: str  # "confirmed" | "contradicted" | "unverified"
    location: Location
    expect: str | None = None  # the hypothesis the probe should report as matched
    evidence: str = ""
    category: Category | None = None

    @property
    def distribution(self) -> str:
        return self.version.split("==", 1)[0].strip()

    @property
    def observed_version(self) -> str | None:
        return self.version.split("==", 1)[1].strip() if "==" in self.version else None


@dataclass(frozen=True, eq=False)  # compared (and cached) by identity: one parsed document
class Contracts:
    path: str
    conventions: tuple[Convention, ...]
    observations: tuple[Observation, ...]

    def convention_for(self, callee: str, role: str | None = None) -> Convention | None:
        """The first convention (document order) whose pattern matches; specific ones come first."""
        return _convention_for(self, callee, role)


@functools.lru_cache(maxsize=4096)
def _convention_for(contracts: Contracts, callee: str, role: str | None) -> Convention | None:
    for conv in contracts.conventions:
        if (role is None or conv.role == role) and conv.matches(callee):
            return conv
    return None


@dataclass(frozen=True)
class ContractCheck:
    observation: Observation
    status: str  # "confirmed" | "contradicted" | "not-checkable"
    reason: str
    stale: bool = False  # observed on a different version than the installed one
    installed_version: str | None = None
    probe_result: ProbeResult | None = None


# ---------------------------------------------------------------- patterns


@functools.lru_cache(maxsize=512)
def _pattern_regex(pattern: str) -> re.Pattern[str]:
    parts: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith(".*.", i):
            parts.append(r"(?:\.|\..*\.)")
            i += 3
        elif pattern[i] == "*":
            parts.append(".*")
            i += 1
        else:
            parts.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(parts))


def pattern_matches(pattern: str, dotted: str) -> bool:
    """fnmatch-like on dotted names, where `.*.` may also stand for a single dot."""
    return _pattern_regex(pattern).fullmatch(dotted) is not None


# ---------------------------------------------------------------- loading


_FENCE = re.compile(r"^```yaml\s*$")


def _blocks(text: str) -> Iterator[tuple[int, str]]:
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if _FENCE.match(lines[i].strip()):
            start = i + 2  # 1-based line of the block's first content line
            body: list[str] = []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            yield start, "\n".join(body)
        i += 1


def _need(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in d or d[key] in (None, ""):
        raise ContractError(f"{where}: missing `{key}`")
    return d[key]


def _as_tuple(value: Any, where: str, key: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ContractError(f"{where}: `{key}` must be a string or a list of strings")


def _parse_flag(raw: Any, where: str) -> Flag | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ContractError(f"{where}: `flag` must be a mapping {{name, default, when_true, when_false}}")
    flag = Flag(
        name=str(_need(raw, "name", where)),
        default=bool(raw.get("default", False)),
        when_true=str(_need(raw, "when_true", where)),
        when_false=str(_need(raw, "when_false", where)),
        aliases=_as_tuple(raw["aliases"], where, "flag.aliases") if raw.get("aliases") else (),
    )
    for eff in (flag.when_true, flag.when_false):
        if eff not in FLAG_EFFECTS:
            raise ContractError(f"{where}: flag effect {eff!r} is not one of {', '.join(FLAG_EFFECTS)}")
    return flag


def _parse_convention(raw: Any, loc: Location) -> Convention:
    where = str(loc)
    if not isinstance(raw, dict):
        raise ContractError(f"{where}: `convention` must be a mapping")
    role = str(_need(raw, "role", where))
    if role not in ("producer", "consumer"):
        raise ContractError(f"{where}: role {role!r} must be producer or consumer")
    base = str(_need(raw, "lse_base", where))
    if base not in LSE_BASES:
        raise ContractError(f"{where}: lse_base {base!r} must be one of {', '.join(LSE_BASES)}")
    layout = str(raw.get("lse_layout", "none"))
    if layout not in LSE_LAYOUTS:
        raise ContractError(f"{where}: lse_layout {layout!r} must be one of {', '.join(LSE_LAYOUTS)}")
    flag = _parse_flag(raw.get("flag"), where)
    if base == "param-dependent" and (flag is None or {flag.when_true, flag.when_false} != {"2", "e"}):
        raise ContractError(f"{where}: a param-dependent lse_base needs a flag selecting \"2\" or \"e\"")
    params = raw.get("lse_params") or {}
    if not isinstance(params, dict) or not all(isinstance(v, int) for v in params.values()):
        raise ContractError(f"{where}: `lse_params` must map parameter names to positions")
    returns = raw.get("returns_lse")
    if returns is not None and (not isinstance(returns, dict) or not isinstance(returns.get("index"), int)):
        raise ContractError(f"{where}: `returns_lse` must be a mapping with an integer `index`")
    probe = raw.get("probe") or {}
    if not isinstance(probe, dict):
        raise ContractError(f"{where}: `probe` must be a mapping {{family, target}}")
    lse_result = raw.get("lse_result")
    if lse_result is not None and not isinstance(lse_result, int):
        raise ContractError(f"{where}: `lse_result` must be an integer")
    scales = raw.get("scale_params") or {}
    if not isinstance(scales, dict) or not all(
        isinstance(v, dict) and v.get("form") in ("float", "tensor") and isinstance(v.get("position", -1), int) for v in scales.values()
    ):
        raise ContractError(f"{where}: `scale_params` must map names to {{position, form: float|tensor}}")
    return Convention(
        components=_as_tuple(_need(raw, "component", where), where, "component"),
        role=role,
        lse_base=base,
        lse_layout=layout,
        location=loc,
        flag=flag,
        lse_result=lse_result,
        lse_out_param=raw.get("lse_out_param"),
        lse_out_position=raw.get("lse_out_position") if isinstance(raw.get("lse_out_position"), int) else None,
        lse_params={str(k): int(v) for k, v in params.items()},
        returns_lse=dict(returns) if returns else None,
        output_lse_param=raw.get("output_lse_param"),
        scale_params={str(k): dict(v) for k, v in scales.items()},
        kv_layout=str(raw.get("kv_layout", "")),
        scale_form=str(raw.get("scale_form", "")),
        probe_family=probe.get("family"),
        probe_target=probe.get("target"),
        note=str(raw.get("note", "")),
    )


_PROBE_CATEGORY = {
    "lse": Category.LSE,
    "layout": Category.LAYOUT,
    "fp8-scale": Category.FP8_SCALE,
    "dcp": Category.DCP,
    "query-count": Category.QUERY_COUNT,
    "padding": Category.PADDING,
    "graph-capture": Category.GRAPH_CAPTURE,
}


def _parse_observation(raw: Any, loc: Location) -> Observation:
    where = str(loc)
    if not isinstance(raw, dict):
        raise ContractError(f"{where}: `observation` must be a mapping")
    probe = _need(raw, "probe", where)
    if not isinstance(probe, dict):
        raise ContractError(f"{where}: `probe` must be a mapping {{name, family, target}}")
    ref = ProbeRef(
        name=str(_need(probe, "name", where)),
        family=str(_need(probe, "family", where)),
        target=str(_need(probe, "target", where)),
    )
    result = str(_need(raw, "result", where))
    if result not in OBS_RESULTS:
        raise ContractError(f"{where}: result {result!r} must be one of {', '.join(OBS_RESULTS)}")
    category = raw.get("category")
    try:
        cat = Category(category) if category else _PROBE_CATEGORY.get(ref.name)
    except ValueError as exc:
        raise ContractError(f"{where}: unknown category {category!r}") from exc
    return Observation(
        id=str(_need(raw, "id", where)),
        component=str(_need(raw, "component", where)),
        version=str(_need(raw, "version", where)),
        device=str(_need(raw, "device", where)),
        date=str(_need(raw, "date", where)),
        claim=str(_need(raw, "claim", where)),
        probe=ref,
        result=result,
        location=Location(loc.path, loc.line, str(raw["id"])),
        expect=str(raw["expect"]) if raw.get("expect") is not None else None,
        evidence=str(raw.get("evidence", "")),
        category=cat,
    )


def parse_contracts(text: str, path: str = CONTRACTS_FILE) -> Contracts:
    """Parse the yaml blocks of a contracts document; `path` is only used in locations."""
    import yaml  # a core dependency, imported here to keep `--help` fast

    # libyaml's parser where PyYAML has it (7x faster: 0.02 s of every review), the same safe
    # constructors; a block it rejects is parsed again by the pure one, whose words the error quotes
    fast = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    conventions: list[Convention] = []
    observations: list[Observation] = []
    seen: dict[str, Location] = {}
    for line, body in _blocks(text):
        loc = Location(path, line - 1)  # the fence line, where a reader starts looking
        try:
            try:
                data = yaml.load(body, Loader=fast)  # a safe loader (CSafeLoader or SafeLoader)
            except yaml.YAMLError:
                data = yaml.safe_load(body)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = Location(path, line + mark.line) if mark is not None else loc
            raise ContractError(f"{at}: malformed yaml block: {getattr(exc, 'problem', exc)}") from exc
        if not isinstance(data, dict) or len(data) != 1:
            raise ContractError(f"{loc}: a yaml block holds exactly one `convention:` or `observation:` mapping")
        (kind, raw), = data.items()
        if kind == "convention":
            conventions.append(_parse_convention(raw, loc))
        elif kind == "observation":
            obs = _parse_observation(raw, loc)
            if obs.id in seen:
                raise ContractError(f"{loc}: observation id {obs.id} already used at {seen[obs.id]}")
            seen[obs.id] = loc
            observations.append(obs)
        else:
            raise ContractError(f"{loc}: unknown block kind {kind!r} (expected convention or observation)")
    return Contracts(path=path, conventions=tuple(conventions), observations=tuple(observations))


def load_contracts(path: Path) -> Contracts:
    """Read component-contracts.md; a malformed block raises ContractError naming file:line."""
    try:
        text = inputs.read_text(path)
    except OSError as exc:
        raise ContractError(f"cannot read contracts file {path}: {exc.strerror}; pass the path to component-contracts.md") from exc
    return parse_contracts(text, Path(path).name)


# ---------------------------------------------------------------- checking


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _norm_dist(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.lower())


def _judge(obs: Observation, res: ProbeResult) -> tuple[str, str]:
    if res.verdict in ("not-checkable", "skipped", "error"):
        why = res.skipped_reason or str(res.details.get("error", "")) or res.verdict
        return "not-checkable", f"probe {obs.probe} {res.verdict}: {why}"
    measured = f"matched {res.matched!r}" if res.matched else "matched no hypothesis"
    if res.worst_error is not None:
        measured += f" (worst error {res.worst_error:.3g})"
    on = f"on {res.device or 'unknown device'}"
    # The probe's verdict compares with what the *target* declares; the claim is judged by the
    # hypothesis it matched, so a target that declares nothing can still confirm a claim.
    if obs.expect is not None:
        if res.matched and _norm(obs.expect) in _norm(res.matched):
            return "confirmed", f"probe {obs.probe} {measured} {on}"
        return "contradicted", f"probe {obs.probe} {measured}, the claim expects {obs.expect!r} {on}"
    if res.verdict == "matched":
        return "confirmed", f"probe {obs.probe} {measured} {on}"
    return "contradicted", f"probe {obs.probe} {measured}, expected {res.expected!r} {on}"


def check_contracts(
    contracts: Contracts,
    *,
    run_probe: Callable[[str, str, str], ProbeResult],
    installed_versions: dict[str, str],
) -> list[ContractCheck]:
    """Rerun each observation's probe (run_probe(target, family, probe_name)) and judge the claim.

    A probe that raises an AuditError, is skipped or lacks a control is "not-checkable" with
    its reason; the check is stale when the installed version differs from the observed one.
    """
    installed = {_norm_dist(k): v for k, v in installed_versions.items()}
    if "metax-audit" not in installed:  # the project's own kernels (H2O) are versioned with the tool
        from metax_audit import __version__

        installed["metax-audit"] = __version__
    checks: list[ContractCheck] = []
    for obs in contracts.observations:
        have = installed.get(_norm_dist(obs.distribution))
        stale = have is not None and obs.observed_version is not None and have != obs.observed_version
        if have is None:
            checks.append(ContractCheck(obs, "not-checkable", f"{obs.distribution} is not installed in the target environment"))
            continue
        if obs.result == "unverified" and obs.expect is None:
            checks.append(ContractCheck(obs, "not-checkable", "the observation names no expected hypothesis (`expect:`)", stale, have))
            continue
        try:
            res = run_probe(obs.probe.target, obs.probe.family, obs.probe.name)
        except AuditError as exc:
            checks.append(ContractCheck(obs, "not-checkable", f"probe {obs.probe} could not run: {exc}", stale, have))
            continue
        status, reason = _judge(obs, res)
        checks.append(ContractCheck(obs, status, reason, stale, have, res))
    return checks


RULE_CONTRADICTED = rule(
    "MXA500",
    Category.CLAIM,
    Severity.ERROR,
    "a recorded kernel contract is contradicted by its probe on this machine",
    "component-contracts.md records a claim about a kernel that the port's code relies on; rerunning "
    "the claim's probe on the installed stack gave a different answer. Update the contract (and every "
    "call site that relies on it) or find out why the installed kernel differs.",
)
RULE_STALE = rule(
    "MXA501",
    Category.COVERAGE,
    Severity.INFO,
    "a kernel contract was observed on a different version than the one installed",
    "The observation in component-contracts.md names another version of the component. Run "
    "`metax-audit contracts --check` on a machine with the kernels and record the new result.",
)


def contract_findings(checks: Sequence[ContractCheck]) -> Iterator[Finding]:
    """A contradicted observation is a finding (category from its probe); a stale one is info."""
    for chk in checks:
        obs = chk.observation
        where = f"{obs.location.path}:{obs.location.line}"
        if chk.status == "contradicted":
            f = make_finding(
                RULE_CONTRADICTED.id,
                obs.location,
                f"{obs.id}: {obs.claim} — contradicted on the installed {obs.distribution} {chk.installed_version}",
                [
                    f"contract {where} ({obs.component}, observed {obs.version} on {obs.device}, {obs.date})",
                    chk.reason,
                    *([f"hypotheses: {chk.probe_result.hypotheses}"] if chk.probe_result and chk.probe_result.hypotheses else []),
                ],
            )
            if obs.category is not None:
                f = Finding(f.rule, obs.category, f.severity, f.location, f.message, f.evidence)
            yield f
        elif chk.stale:
            yield make_finding(
                RULE_STALE.id,
                obs.location,
                f"{obs.id} was observed on {obs.version}; installed is {chk.installed_version}",
                [f"contract {where}", f"status on this machine: {chk.status}: {chk.reason}"],
            )


def validation_for(callee: str, contracts: Contracts) -> str | None:
    """The probe command that validates a traced call to `callee`, for the inventory."""
    probes: list[str] = []
    family = target = None
    conv = contracts.convention_for(callee)
    siblings = set(conv.components) if conv is not None else set()
    for obs in contracts.observations:
        if pattern_matches(obs.component, callee) or obs.component in siblings:
            family, target = family or obs.probe.family, target or obs.probe.target
            if obs.probe.name not in probes:
                probes.append(obs.probe.name)
    if conv is not None and conv.probe_family and conv.probe_target:
        family, target = family or conv.probe_family, target or conv.probe_target
        if not probes and conv.lse_base != "none":
            probes.append("lse")
        if conv.role == "consumer" and conv.lse_base != "none" and "dcp" not in probes:
            probes.append("dcp")
    if not probes or family is None or target is None:
        return None
    return f"metax-audit probe --target {target} --family {family} --probes {','.join(probes)}"


def contracts_to_dict(contracts: Contracts, checks: Sequence[ContractCheck] = ()) -> dict[str, Any]:
    """A JSON-ready view for `metax-audit contracts` (status is the recorded result until checked)."""
    by_id = {c.observation.id: c for c in checks}
    observations = []
    for obs in contracts.observations:
        chk = by_id.get(obs.id)
        observations.append({
            "id": obs.id,
            "component": obs.component,
            "version": obs.version,
            "device": obs.device,
            "date": obs.date,
            "claim": obs.claim,
            "probe": f"{obs.probe.name} --family {obs.probe.family} --target {obs.probe.target}",
            "expect": obs.expect,
            "recorded": obs.result,
            "status": chk.status if chk else obs.result,
            "reason": chk.reason if chk else obs.evidence,
            "stale": chk.stale if chk else None,
            "installed_version": chk.installed_version if chk else None,
            "location": str(obs.location),
        })
    conventions = [
        {
            "component": list(c.components),
            "role": c.role,
            "lse_base": c.lse_base,
            "flag": None if c.flag is None else {"name": c.flag.name, "default": c.flag.default,
                                                  "when_true": c.flag.when_true, "when_false": c.flag.when_false},
            "lse_layout": c.lse_layout,
            "kv_layout": c.kv_layout,
            "scale_form": c.scale_form,
            "location": str(c.location),
        }
        for c in contracts.conventions
    ]
    return {"schema": "metax-audit/contracts/v1", "path": contracts.path, "conventions": conventions, "observations": observations}


def default_contracts_path() -> Path:
    """The project's contracts: shipped inside the package (a link to the top-level file in a
    checkout, a copy in a wheel)."""
    return Path(__file__).parent / "component-contracts.md"


def project_contracts() -> Contracts | None:
    """component-contracts.md as shipped with metax-audit, parsed (the review keeps the parsed
    contracts in the result cache: pipeline/review.py kept_project_contracts)."""
    path = default_contracts_path()
    return load_contracts(path) if path.is_file() else None


def probe_suggester(contracts: Contracts | None) -> Callable[[str], str | None] | None:
    """callee -> the probe command the contracts name for it."""
    return None if contracts is None else (lambda callee: validation_for(callee, contracts))
