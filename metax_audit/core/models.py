# The frozen records that flow between pipeline stages (snapshot -> discover -> trace ->
# introspect -> compare -> checks -> probe -> inventory -> report); no stage logic here.
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        return {"error": 3, "warning": 2, "info": 1}[self.value]


class Category(StrEnum):
    """The fixed finding vocabulary of DESIGN.md; rule ids live in findings.py."""

    REGISTRATION = "registration"
    IMPORT = "import"
    SIGNATURE = "signature"
    KWARGS_SWALLOWED = "kwargs-swallowed"
    UPSTREAM_DRIFT = "upstream-drift"
    UNDECLARED_DIFFERENCE = "undeclared-difference"
    ARCH_CHECK = "arch-check"
    CLAIM = "claim"
    INACTIVE_PATH = "inactive-path"
    LAYOUT = "layout"
    FP8_SCALE = "fp8-scale"
    LSE = "lse"
    DCP = "dcp"
    GRAPH_CAPTURE = "graph-capture"
    QUERY_COUNT = "query-count"
    PADDING = "padding"
    INDEX_MAPPING = "index-mapping"
    ENVIRONMENT = "environment"
    COVERAGE = "coverage"


@dataclass(frozen=True, order=True)
class Location:
    """A place in the audited snapshot: repo-relative path (never the temp dir) and 1-based line."""

    path: str
    line: int = 0
    symbol: str = ""

    def __str__(self) -> str:
        return f"{self.path}:{self.line}" if self.line else self.path


@dataclass(frozen=True)
class Site:
    """One place a finding stands for (a hunk of a difference, an import, a call, a use that fails with it):
    typed evidence, so renderers format it and later passes read it without parsing a string back."""

    path: str
    line: int = 0
    symbol: str = ""
    kind: str = ""  # what is there: a difference kind ("upstream-not-followed"), "import", "use", "call", "read"
    detail: str = ""  # the statement or the change, as the stage that found it wrote it
    verdict: str = ""  # "" when it may change what a kernel computes; "info: why", "declared: reason" otherwise
    upstream: str = ""  # the upstream path:line it follows, "" when none
    change: str = ""  # for drift, what upstream did after the base release (Difference.change)
    keywords: tuple[str, ...] = ()  # keyword changes at calls, "callee:+kw" / "callee:-kw" (Difference.keywords)

    def __str__(self) -> str:
        return f"{self.path}:{self.line}" if self.line else self.path


@dataclass(frozen=True)
class UpstreamCaller:
    """Typed evidence of an override finding: an upstream call of the method through the base's interface
    that passes what the override does not take, and whether it can run on the port (compare/liveness.py)."""

    path: str  # the upstream release's file
    line: int
    function: str  # the function it sits in, "Class.method" or "func"; "" at module level
    passes: str  # what it passes that the override refuses: "cache_dtype_str=" or "5 positional arguments"
    live: bool | None = None  # None: not judged; False: the port replaces or overrides every way to it
    why: str = ""  # the liveness evidence: how the port reaches it, or what replaces it

    def __str__(self) -> str:
        head = f"upstream caller {self.path}:{self.line} passes {self.passes}"
        if self.live is False:
            return f"not evidence: {head}, but {self.why}"
        return f"{head}, {self.why}" if self.why else head


@dataclass(frozen=True)
class InstalledSignature:
    """Typed evidence of a binding finding: the callable the call was checked against and where its
    signature was read. Renderers format it (str() is the evidence line the Markdown shows)."""

    callable: str  # dotted qualname: "flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run"
    signature: str  # "(self, q, *, out=None)"; "" when none could be read
    # "installed": imported in the target interpreter; "manifest": a captured stack manifest; "public-base": the
    # public release of a pinned vendor build, read statically; "static": read from source (port, upstream, stub)
    read_from: Literal["installed", "manifest", "public-base", "static"]
    origin: str  # how the reading stage says it: "import", "static via manifest:m.json", "upstream vllm 0.26.0"
    file: str = ""  # the file it was read from, as shown: a file name of the stack, a snapshot-relative path
    line: int = 0
    distribution: str = ""  # the installed distribution and version, when known
    version: str = ""
    style: Literal["installed", "def"] = "installed"  # how str() writes it (the two evidence lines of the checks)
    defined_as: str = ""  # style "def": the name its def statement gives it

    def __str__(self) -> str:
        if self.style == "def":  # `origin: path:line: def name(params)` (a port or upstream callee)
            return f"{self.origin}: {self.file}:{self.line}: def {self.defined_as}{self.signature}"
        dist = " ".join(x for x in (self.distribution, self.version) if x)
        where = f" at {self.file}:{self.line}" if self.file and self.line else ""
        return f"installed: {self.callable}{self.signature or '(?)'}  [{self.origin}{', ' + dist if dist else ''}]{where}"


@dataclass(frozen=True)
class ProbeEvidence:
    """Typed evidence of a probe finding: which probe ran on what, its verdict and what it observed."""

    probe: str  # "lse", "layout", ...
    target: str  # "flashinfer:BatchDecodeWithPagedKVCacheWrapper"
    family: str  # "paged-decode"
    verdict: str  # ProbeVerdict: "mismatch", "error", "not-checkable", ...
    observed: str  # the hypothesis the kernel matched ("" none), or why it could not be checked
    expected: str = ""  # the hypothesis a correct kernel matches
    device: str = ""


# The closed sets of words the records use (typing.Literal: the values stay plain strings in the
# JSON report and in comparisons, and mypy checks every place that writes one).
SnapshotMode = Literal["staged", "worktree", "rev", "installed", "directory"]
SourceReason = Literal["glob", "platform", "reached-by-trace", "explicit", "counterpart"]
RegistrationKind = Literal["attention-backend", "mla-prefill", "custom-op", "decorator"]
FactStatus = Literal["ok", "import-error", "not-found", "no-signature", "timeout", "crash"]
ProbeVerdict = Literal["matched", "mismatch", "not-checkable", "skipped", "error"]
FileStatus = Literal["ok", "needs-action", "not-analysed"]
# Where a call's target lives: the port, the upstream release, another package (the kernel stack),
# Python/torch builtins, or nowhere the trace could resolve.
CallOrigin = Literal["port", "upstream", "external", "builtin", "unresolved"]
# What a port file does differently from its upstream counterpart (compare/rules.py ACTIONS says
# what each asks of the maintainer); "upstream-followed"/"upstream-not-followed" are the three-way view.
DifferenceKind = Literal[
    "vendor-kernel-import", "port-module-import", "foreign-platform-branch", "arch-check", "feature-disabled",
    "fallback-added", "argument-commented-out", "upstream-not-followed", "upstream-followed", "signature-changed",
    "class-attribute", "call-changed", "added", "removed", "changed", "cosmetic", "moved",
]
# Who made a difference: the port alone, upstream after the base release (the port kept the old form),
# upstream itself (kept unchanged by the port), or "" when no base release separates the two.
Attribution = Literal["port-only", "drift", "inherited", ""]


# ---------------------------------------------------------------- snapshot


@dataclass(frozen=True)
class SnapshotInfo:
    mode: SnapshotMode
    repo: str  # the user's repo (or site-packages dir for --installed), for the record only
    commit: str | None  # HEAD sha (staged/worktree) or the resolved revision; None without commits
    dirty: bool  # worktree differs from HEAD (staged/worktree modes)
    root: Path  # the temporary export; never shown in reports
    label: str = ""  # the revision as the user wrote it, or the distribution version
    files: int = 0
    notes: tuple[str, ...] = ()  # e.g. "submodule vendor/x exported as a gitlink only"


# ---------------------------------------------------------------- discover


class ParseProblemKind(StrEnum):
    """Why a file in scope has no tree."""

    TOO_LARGE = "too large"  # over max_file_bytes: skipped by size, not broken (MXA002)
    UNREADABLE = "unreadable"
    NOT_DECODABLE = "not decodable"
    SYNTAX = "syntax error"
    PARSER_LIMIT = "parser limit"  # ast.parse/compile raised ValueError, RecursionError or MemoryError


@dataclass(frozen=True)
class ParseProblem:
    kind: ParseProblemKind
    message: str  # as reported: "SyntaxError: invalid syntax (line 3)", "too large: 9 bytes > max_file_bytes 5"
    line: int = 0  # where the parser stopped (SYNTAX); 0 when there is no line

    @property
    def broken(self) -> bool:
        """Not valid Python, or not readable as text; a file skipped by size is neither."""
        return self.kind is not ParseProblemKind.TOO_LARGE


@dataclass(frozen=True)
class SourceFile:
    path: str  # repo-relative, posix
    module: str  # dotted module name, "" when not importable by name
    reason: SourceReason
    problem: ParseProblem | None = None
    lines: int = 0

    @property
    def parse_error(self) -> str | None:
        """Why the file has no tree, as reported; None when it parsed."""
        return self.problem.message if self.problem is not None else None


@dataclass(frozen=True)
class SkippedFile:
    path: str
    reason: str


@dataclass(frozen=True)
class Registration:
    kind: RegistrationKind
    name: str  # enum member or op name, e.g. "FLASHINFER"
    class_path: str  # "vllm_metax.v1.attention.backends.flashinfer.MacaFlashInferBackend"
    location: Location
    resolved: bool  # the class path names a class present in the snapshot
    resolved_path: str | None = None  # repo-relative file holding the class
    # A class path the platform's selector returns: the selector's name and the condition under
    # which it returns this class (branch tests and map keys, alternatives joined by " or ").
    selected_by: str = ""
    condition: str = ""
    literal: bool = True  # backend and class path are written as literals (enum attribute, string)


@dataclass(frozen=True)
class PriorityList:
    condition: str  # the branch text that selects this list ("use_mla", "else")
    members: tuple[str, ...]
    location: Location
    commented_out: tuple[str, ...] = ()


@dataclass(frozen=True)
class ConfigSwitch:
    """A feature the platform turns off or forces, e.g. disable_cascade_attn = True."""

    target: str  # "model_config.disable_cascade_attn"
    value: str
    condition: str
    location: Location


@dataclass(frozen=True)
class Discovery:
    root: Path
    port_package: str
    files: tuple[SourceFile, ...]
    registrations: tuple[Registration, ...]
    priorities: tuple[PriorityList, ...]
    switches: tuple[ConfigSwitch, ...]
    callers: dict[str, tuple[str, ...]]  # file -> files that import from it
    left_out: tuple[SkippedFile, ...] = ()  # in the default scope but excluded by PATHS


# ---------------------------------------------------------------- trace


@dataclass(frozen=True)
class CallArg:
    name: str | None  # keyword name; None for a positional argument
    position: int | None  # index among positionals; None for keywords
    text: str  # source text of the value
    literal: str | None = None  # repr of the value when it is a literal
    commented_out: bool = False  # an argument present only as a comment in the call


@dataclass(frozen=True)
class CallSite:
    location: Location  # where the call is written
    caller: str  # qualified name of the enclosing function
    callee_text: str  # as written: "self._decode_wrapper.run"
    resolved: str | None  # dotted target, e.g. "flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run"
    origin: CallOrigin
    args: tuple[CallArg, ...] = ()
    star_args: bool = False
    star_kwargs: bool = False
    branch: str = ""  # enclosing conditions, outermost first, joined by " / "
    via: str = ""  # how it was resolved: "import-alias", "self-attr", "partial", "lazy-import", "getattr"...
    partial_args: tuple[CallArg, ...] = ()  # arguments bound by functools.partial


@dataclass(frozen=True)
class ChainHop:
    # registration | backend | get-builder-cls | builder | build | builder.<method> | metadata | get-impl-cls |
    # impl | forward | impl.<method> | kv-cache-shape | kv-stride-order | layer | wrapper | kernel: open (the
    # builder's and impl's methods are named by the port), so a plain string.
    role: str
    qualname: str
    path: str
    line: int
    resolved: str | None = None
    inherited_from: str | None = None  # "upstream:vllm.x.Base" when the method comes from a base class


class UnresolvedKind(StrEnum):
    CALL = "call"  # a call the tracer could not resolve (MXA054)
    FILE_NOT_TRACED = "file not traced"  # a file in scope the tracer could not read (MXA055)


@dataclass(frozen=True)
class Unresolved:
    location: Location
    text: str
    reason: str
    kind: UnresolvedKind = UnresolvedKind.CALL


@dataclass(frozen=True)
class BackendChain:
    name: str  # enum member, e.g. "FLASHINFER"
    class_path: str
    registered_at: Location | None
    active: bool  # present in a priority list (or selected explicitly) and not disabled
    chain: tuple[ChainHop, ...]
    calls: tuple[CallSite, ...]
    unresolved: tuple[Unresolved, ...]
    capture_support: str | None = None  # the declared cudagraph support level, as written
    condition: str = ""  # when the platform's selector returns this backend ("" for registry entries)


@dataclass(frozen=True)
class TraceResult:
    backends: tuple[BackendChain, ...]
    reached_files: tuple[str, ...]  # port files pulled in by the trace
    calls: tuple[CallSite, ...] = ()  # every call site in scope (also outside backend chains)
    unresolved: tuple[Unresolved, ...] = ()


# ---------------------------------------------------------------- introspect


@dataclass(frozen=True)
class ParamFact:
    name: str
    kind: str  # inspect.Parameter kind name: POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD, VAR_POSITIONAL, KEYWORD_ONLY, VAR_KEYWORD
    default: str | None = None  # repr, None when required


@dataclass(frozen=True)
class CallableFact:
    target: str  # dotted path
    status: FactStatus
    source: str  # "import" | "static" | "manifest"
    signature: str | None = None
    params: tuple[ParamFact, ...] | None = None
    sourcefile: str | None = None
    line: int | None = None
    doc: str | None = None
    kwargs_reads: tuple[str, ...] | None = None  # names the body reads out of **kwargs
    kwargs_forwarded: bool = False  # **kwargs passed on to another callable
    distribution: str | None = None
    version: str | None = None
    wheel_tag: str | None = None
    error: str | None = None
    stand_in: str | None = None  # read from the public base of a pinned vendor build (stack_pins), said here
    stand_in_extended: bool = False  # and config's vendor-extends says that vendor build adds to the public API


@dataclass(frozen=True)
class StackFacts:
    python: str
    captured_at: str
    host: str
    facts: dict[str, CallableFact]
    distributions: dict[str, dict[str, str]] = field(default_factory=dict)
    source: str = "import"  # "import" | "manifest:<path>"
    cache_entry: str | None = None  # the stack-cache file these facts were served from (None: captured now)
    torch_ops: dict[str, tuple[str, ...]] | None = None  # ns -> ops the dispatcher knew at capture (manifests)


# ---------------------------------------------------------------- compare


@dataclass(frozen=True)
class UpstreamInfo:
    package: str
    version: str | None
    source: str  # "directory:<path>" | "installed:<dist>" | "pip:vllm==X (cache <dir>)"
    root: Path | None = None  # directory holding the upstream package (not shown in reports)


@dataclass(frozen=True)
class Difference:
    kind: DifferenceKind
    path: str
    line: int
    symbol: str
    declared: bool
    reason: str  # the "Metax Modification" text when declared
    action: str
    validation: str
    detail: str = ""
    upstream_line: int | None = None
    note: str = ""  # why it is info (a known vendor adaptation, or the gate of a path the vendor never runs); "" = may change a kernel
    attribution: Attribution = ""
    # For drift: what upstream did after the base release ("method-added", "statements-added", "changed",
    # "signature-changed", ...), typed so later passes need not read it back from `detail`.
    change: str = ""
    # The keyword changes at calls this hunk makes, typed: "callee:+kw" (the port passes it, upstream does not),
    # "callee:-kw" (upstream passes it, the port does not: dropped, commented out, or a local read only as it).
    keywords: tuple[str, ...] = ()


@dataclass(frozen=True)
class FileComparison:
    path: str
    upstream_path: str | None
    vendor_only: bool
    class_map: dict[str, str] = field(default_factory=dict)
    differences: tuple[Difference, ...] = ()
    declared_blocks: int = 0


@dataclass(frozen=True)
class Comparison:
    upstream: UpstreamInfo | None
    base: UpstreamInfo | None
    files: tuple[FileComparison, ...]
    drift: tuple[Difference, ...] = ()


# ---------------------------------------------------------------- dataflow


FlowVerdict = Literal["match", "mismatch", "unknown"]
FlowMismatch = Literal["base", "layout"]  # what a mismatched flow gets wrong


@dataclass(frozen=True)
class FlowStep:
    location: Location
    text: str  # the source line of the step, stripped
    base: str  # the LSE base after the step: "2" | "e" | "se" (exponentiated) | "?"
    layout: str  # "[tokens, heads]" | "[heads, tokens]" | "?"


@dataclass(frozen=True)
class FlowEnd:
    callee: str  # resolved dotted callee
    location: Location
    base: str
    layout: str
    arg: str = ""  # consumer: the parameter receiving the LSE
    via: str = ""  # how the callee was resolved
    convention: str = ""  # where the convention is written (component-contracts.md:line)


@dataclass(frozen=True)
class LseFlow:
    producer: FlowEnd
    consumer: FlowEnd
    steps: tuple[FlowStep, ...]
    verdict: FlowVerdict
    reasons: tuple[str, ...] = ()
    probes: tuple[ProbeRequest, ...] = ()  # the probes that confirm the verdict at run time
    mismatches: tuple[FlowMismatch, ...] = ()  # set when the verdict is mismatch


# ---------------------------------------------------------------- findings and probes


class BaselineState(StrEnum):
    """How a finding relates to the baseline review (`review --staged` compares with HEAD)."""

    NEW = "new"  # no finding with this id in the baseline
    CHANGED = "changed"  # same id, but what it says changed (gates like new)
    UNCHANGED = "unchanged"
    FIXED = "fixed"  # in the baseline only (AuditReport.fixed)

    @property
    def is_new(self) -> bool:
        return self in (BaselineState.NEW, BaselineState.CHANGED)


@dataclass(frozen=True)
class Finding:
    rule: str
    category: Category
    severity: Severity
    location: Location
    message: str
    evidence: tuple[str, ...] = ()
    waived: bool = False
    waiver_reason: str | None = None
    key: str = ""  # what the finding is about (callee and keyword, flow ends...); "" -> the message
    # The fingerprint (fingerprints.py): rule, path, enclosing symbol and key, no line number; set
    # once here, kept by dataclasses.replace, so reports never recompute it.
    id: str = ""
    baseline: BaselineState | None = None  # None when the review had no baseline
    # Ids of the findings triage folded into this one (a difference that is an error's root cause, more
    # findings at one call): a baseline does not call them fixed (baseline.py).
    joined: tuple[str, ...] = ()
    # Every place the finding stands for, its own location first when it is one of them (a file the sync
    # left behind lists each function, an import error each import and each use that fails with it).
    sites: tuple[Site, ...] = ()
    installed: InstalledSignature | None = None  # a binding finding: the signature the call was checked against
    probe: ProbeEvidence | None = None  # a probe finding: the probe's result
    callers: tuple[UpstreamCaller, ...] = ()  # an override finding: the upstream calls that prove it

    def __post_init__(self) -> None:
        if not self.id:
            from metax_audit.core.fingerprints import finding_key, fingerprint

            object.__setattr__(self, "id", fingerprint(self.rule, self.location.path, self.location.symbol,
                                                       finding_key(self.message, self.key)))

    @property
    def site(self) -> tuple[str, str, str, int]:
        """Rule and exact place: two stages reporting the same site are one finding (inventory)."""
        return (self.rule, self.location.path, self.location.symbol, self.location.line)

    @functools.cached_property
    def content(self) -> str:
        """Hash of what the finding says (message, evidence); waivers and baselines compare it."""
        from metax_audit.core.fingerprints import content_hash

        return content_hash(self.message, self.evidence)


@dataclass(frozen=True)
class ProbeRequest:
    """A probe run a stage asks for (a contract's confirmation of a verdict): built once, run as is
    by the probe stage, and rendered as a `metax-audit probe` command only for display."""

    target: str  # "flashinfer:BatchDecodeWithPagedKVCacheWrapper" or "MOD:CALLABLE"
    family: str  # the kernel family (calling convention) of the target
    probes: tuple[str, ...] = ()  # the probes to run; empty: every probe that applies to the family
    options: tuple[tuple[str, str], ...] = ()  # k=v passed to the probe (probes --option)

    @property
    def command(self) -> str:
        words = f"metax-audit probe --target {self.target} --family {self.family}"
        if self.probes:
            words += f" --probes {','.join(self.probes)}"
        if self.options:
            words += "  # options: " + " ".join(f"{k}={v}" for k, v in self.options)
        return words


@dataclass(frozen=True)
class ProbeResult:
    probe: str  # "lse" | "layout" | ...
    family: str  # "paged-decode" | "merge-states" | ...
    target: str  # "flashinfer:BatchDecodeWithPagedKVCacheWrapper" or "MOD:CALLABLE"
    verdict: ProbeVerdict
    matched: str | None = None  # the hypothesis the target matched
    expected: str | None = None  # the hypothesis a correct kernel would match
    hypotheses: dict[str, float | None] = field(default_factory=dict)  # worst abs error per hypothesis (None: not recorded)
    worst_error: float | None = None
    device: str | None = None
    skipped_reason: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- inventory and report


@dataclass(frozen=True)
class FileRecord:
    path: str
    reason: str  # why it is in scope
    upstream_path: str | None
    registrations: tuple[Registration, ...]
    callers: tuple[str, ...]
    differences: tuple[Difference, ...]
    findings: tuple[str, ...]  # finding ids
    probes: tuple[str, ...]  # probes that cover this file's kernels
    status: FileStatus
    status_reason: str = ""


@dataclass(frozen=True)
class Coverage:
    in_scope: int
    analysed: int
    skipped: tuple[SkippedFile, ...] = ()
    left_out: tuple[SkippedFile, ...] = ()


@dataclass(frozen=True)
class UnboundPackage:
    """A pinned kernel package the review could not bind (installed, manifest, kernel-sources or public base),
    accepted on purpose with allow-unbound: every call into it went unchecked, and every headline says so."""

    module: str  # the import package: "flash_mla"
    pin: str  # as pinned: "flash_mla==1.0.1+metax3.8.0.7torch2.10"
    location: Location  # the line that pins it
    why: str  # why it could not be bound
    calls: int  # traced call sites into it: not checked
    accepted_by: str  # where allow-unbound named it: "--allow-unbound", ".metax-audit.yaml"


@dataclass(frozen=True)
class StageRecord:
    name: str
    ran: bool
    seconds: float = 0.0
    note: str = ""


@dataclass(frozen=True)
class TestRun:
    command: str
    exit_code: int
    seconds: float
    output_tail: str


@dataclass(frozen=True)
class AuditReport:
    tool_version: str
    snapshot: SnapshotInfo
    upstream: UpstreamInfo | None
    environment: dict[str, Any]
    backends: tuple[BackendChain, ...]
    files: tuple[FileRecord, ...]
    findings: tuple[Finding, ...]
    probes: tuple[ProbeResult, ...]
    coverage: Coverage
    stages: tuple[StageRecord, ...]
    test_run: TestRun | None = None
    generated_at: str = ""
    wall_seconds: float = 0.0
    waivers: dict[str, Any] = field(default_factory=dict)
    schema: str = "metax-audit/report/v1"
    base: UpstreamInfo | None = None
    # Every LSE/layout/scale flow from a producing kernel call to a consumer.
    dataflow: tuple[LseFlow, ...] = ()  # the release the port was last synced to (three-way view), when given
    # The review this one was compared with (baseline.py): rev, commit and counts per state; the
    # findings carry their state, and `fixed` holds the baseline's findings this review lacks.
    baseline_info: dict[str, Any] = field(default_factory=dict)
    fixed: tuple[Finding, ...] = ()
    unbound: tuple[UnboundPackage, ...] = ()  # pinned kernel packages accepted unbound (allow-unbound)
