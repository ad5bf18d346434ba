# The command line: each command parses, calls one function of the core, renders, exits.
# Only this module (and cli_progress) prints; heavy imports stay inside the commands.
from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from metax_audit import __version__
from metax_audit.core.errors import AuditError

if TYPE_CHECKING:
    from metax_audit.core.models import SnapshotMode

EXIT_CLEAN, EXIT_FINDINGS, EXIT_CANNOT_AUDIT = 0, 1, 2

app = typer.Typer(
    name="metax-audit",
    help=(
        "Audit a vendor port of vLLM's attention backends: trace each backend from registration to "
        "kernel, check call sites against the installed kernels, compare with upstream vLLM, probe "
        "kernel semantics on a device. Exit codes: 0 clean, 1 findings at or above --fail-on, "
        "2 could not audit."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)



def _flags_take_no_value() -> None:
    """typer's help shows a flag's type (`--staged <bool>`) as if it took a value; a flag takes none,
    so its type column stays empty (as click's own help and every other CLI write it)."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None or getattr(shown, "_flags_plain", False):
        return

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag and self.metavar is None else shown(self, ctx)

    display_type_rich._flags_plain = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_take_no_value()
_state = {"debug": False, "main": False}
_started: list[float] = []  # main(): when the process started (clock.process_started())


def _version(value: bool) -> None:
    if value:
        typer.echo(f"metax-audit {__version__}")
        raise typer.Exit(EXIT_CLEAN)


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of errors.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")] = False,
) -> None:
    _state["debug"] = debug


def _fail(message: str) -> typer.Exit:
    from metax_audit.report.text import visible

    # one line, whatever the message quotes from the repo (a newline or an ESC in a file name)
    typer.echo(f"metax-audit: error: {visible(message)}", err=True)
    return typer.Exit(EXIT_CANNOT_AUDIT)


def visible_line(text: str) -> str:
    from metax_audit.report.text import visible

    return visible(text)


def _interrupt(signum: int, frame: object) -> None:
    _ignore_interrupts()  # the first one unwinds; a second cannot cut the clean-up or the exit short
    raise KeyboardInterrupt


def _ignore_interrupts() -> None:
    """From the first interrupt on, the process (main() only, not a CliRunner's host) ignores SIGINT
    and SIGTERM: a second Ctrl-C or a CI runner's repeated signal would otherwise raise again inside
    the snapshot's removal, or kill the interpreter outright once it has reset the handlers while
    exiting (-2 instead of 130)."""
    if not _state["main"]:
        return
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)


def _interrupted(message: str) -> int:
    """The one line of an interrupted run; its exit code, 130."""
    _ignore_interrupts()
    # CPython marks a KeyboardInterrupt that escaped code compiled from a string (exec/eval: a
    # @dataclass or namedtuple being created by a lazy import when the signal came) as unhandled,
    # and `python -m` then kills itself with SIGINT at exit (-2) whatever exit code we give. Running
    # any string code clears that mark (pythonrun.c, run_eval_code_obj); this run has handled it.
    exec("")
    typer.echo(message, err=True)
    return 130


class _Guard:
    """Maps AuditError (and anything unexpected) to one stderr line and exit 2, no traceback."""

    def __enter__(self) -> None:
        # SIGTERM (a CI job cancelled) unwinds like Ctrl-C, so snapshots are removed; Ctrl-C does
        # too, through the same handler (unless SIGINT was ignored when we started: nohup, `cmd &`).
        if hasattr(signal, "SIGTERM"):
            signal.signal(signal.SIGTERM, _interrupt)
        # a closed terminal (SIGHUP) too, unless it was ignored when we started (nohup)
        if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) is signal.SIG_DFL:
            signal.signal(signal.SIGHUP, _interrupt)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _interrupt)

    def __exit__(self, kind, exc, tb) -> Literal[False]:  # type: ignore[no-untyped-def]
        if exc is None or isinstance(exc, typer.Exit | SystemExit):
            return False
        if _state["debug"]:  # --debug adds the traceback; the exit code stays the documented one
            import traceback

            traceback.print_exception(exc, file=sys.stderr)
        if isinstance(exc, KeyboardInterrupt):
            raise typer.Exit(_interrupted("metax-audit: interrupted; the temporary snapshot was removed"))
        from metax_audit.core.errors import StackBindingError

        if isinstance(exc, StackBindingError):  # one line per package that could not be bound, each with its ways out
            for line in exc.lines[:-1]:
                typer.echo(f"metax-audit: error: {visible_line(line)}", err=True)
            raise _fail(exc.lines[-1])
        if isinstance(exc, AuditError):
            raise _fail(str(exc))
        raise _fail(f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)")


def _formats(value: str) -> tuple[str, ...]:
    from metax_audit.report import ALL_FORMATS as known
    chosen = tuple(v.strip() for v in value.split(",") if v.strip())
    bad = [v for v in chosen if v not in known]
    if bad:
        raise typer.BadParameter(f"unknown format {bad[0]!r} (choose from {', '.join(known)})")
    return chosen


def _progress(quiet: bool = False):  # type: ignore[no-untyped-def]
    from metax_audit.cli.progress import make_progress
    from metax_audit.core.progress import QuietProgress

    return QuietProgress() if quiet else make_progress()


def _terminal(color: str, quiet: bool = False) -> None:
    """--color and --quiet, checked and handed to the renderers."""
    from metax_audit.cli.term import COLOR_MODES

    if color not in COLOR_MODES:
        raise _fail(f"--color must be auto, always or never (got {color!r})")
    from metax_audit.cli.render import configure

    configure(color=color, quiet=quiet)


ModeStaged = Annotated[bool, typer.Option("--staged", help="Review the git index (the default when something is staged).")]
ModeWorktree = Annotated[bool, typer.Option("--worktree", help="Review tracked plus untracked-not-ignored files.")]
ModeRev = Annotated[str | None, typer.Option("--rev", help="Review a revision (commit, tag, branch).")]
RepoOpt = Annotated[Path | None, typer.Option("--repo", help="The port's git checkout (default: the enclosing repo).")]
UpstreamOpt = Annotated[str | None, typer.Option("--upstream", help="Upstream vLLM: a directory, a git clone at a revision (PATH@REV, read with git archive), an installed package, or vllm==X.Y.Z (downloaded once, cached).")]
PythonOpt = Annotated[str | None, typer.Option("--python", help="Interpreter of the kernel stack to introspect/probe (default: this one).")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="Config file (default: .metax-audit.yaml or \\[tool.metax-audit] in the port's pyproject.toml).")]
TextFormatOpt = Annotated[str, typer.Option("--format", help="text | json")]
JsonAliasOpt = Annotated[bool, typer.Option("--json", hidden=True, help="The same as --format json.")]
ColorOpt = Annotated[str, typer.Option("--color", help="auto | always | never (auto: colour on a terminal, none under NO_COLOR; FORCE_COLOR forces it).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", help="Print the headline and the counts only.")]


def _text_or_json(fmt: str, as_json: bool) -> bool:
    """--format text | json (and the older --json) of trace, evidence and contracts: True for JSON."""
    if fmt not in ("text", "json"):
        raise _fail(f"--format must be text or json (got {fmt!r})")
    return as_json or fmt == "json"


def _not_empty(**values: str | None) -> None:
    """An option given as an empty string is a mistake (an unset CI variable), never "not given"."""
    for name, value in values.items():
        if value is not None and not value.strip():
            what = "an interpreter path" if name == "python" else "a directory, an installed package or vllm==X.Y.Z"
            raise _fail(f"--{name} is empty; give {what}")


def _mode(staged: bool, worktree: bool, rev: str | None, installed: bool = False) -> SnapshotMode | None:
    options: tuple[tuple[SnapshotMode, bool], ...] = (
        ("staged", staged), ("worktree", worktree), ("rev", rev is not None), ("installed", installed))
    chosen = [m for m, on in options if on]
    if len(chosen) > 1:
        raise _fail(f"choose one of --staged, --worktree, --rev, --installed (got {', '.join('--' + c for c in chosen)})")
    return chosen[0] if chosen else None


@app.command()
def review(
    paths: Annotated[list[str] | None, typer.Argument(help="Narrow the scope to these repo-relative paths or globs.")] = None,
    staged: ModeStaged = False,
    worktree: ModeWorktree = False,
    rev: ModeRev = None,
    installed: Annotated[bool, typer.Option("--installed", help="Review the port as installed in site-packages.")] = False,
    repo: RepoOpt = None,
    upstream: UpstreamOpt = None,
    base: Annotated[str | None, typer.Option("--base", help="The upstream release the port was last synced to (three-way drift); default: the release the port declared before its last sync commit, when its history says so.")] = None,
    stack: Annotated[Path | None, typer.Option("--stack", help="A stack manifest (evidence --capture-stack) used instead of importing kernels.")] = None,
    python: PythonOpt = None,
    config: ConfigOpt = None,
    fmt: Annotated[str, typer.Option("--format", help="Comma list of md,json,sarif,junit (files in --output-dir) github (workflow-command annotations on stdout) and text (one line per finding on stdout instead of the summary: path:line: severity rule message).")] = "md,json,sarif,junit",
    output_dir: Annotated[Path | None, typer.Option("--output-dir", help="Where reports go (default: a per-repository directory under the metax-audit cache, outside the checkout; CI passes reports/).")] = None,
    fail_on: Annotated[str | None, typer.Option("--fail-on", help="error | warning | info | never (default: fail-on in the config, else error)")] = None,
    waivers: Annotated[Path | None, typer.Option("--waivers", help="YAML file of accepted findings.")] = None,
    generate_waivers: Annotated[Path | None, typer.Option("--generate-waivers", help="Write a starting waivers file for the current findings.")] = None,
    test: Annotated[str | None, typer.Option("--test", help="Run this command with the snapshot as cwd and first on PYTHONPATH.")] = None,
    probe: Annotated[bool, typer.Option("--probe", help="Also run the probes for the traced kernels (needs the kernels and a device).")] = False,
    baseline: Annotated[str | None, typer.Option("--baseline", help="Compare with this revision: each finding new, changed, unchanged or fixed (--staged/--worktree default: HEAD).")] = None,
    merge_base: Annotated[str | None, typer.Option("--merge-base", help="Compare with the merge base of the reviewed commit and this branch.")] = None,
    no_baseline: Annotated[bool, typer.Option("--no-baseline", help="Do not compare with a baseline.")] = False,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Recompute everything: do not read or write the result cache.")] = False,
    new_only: Annotated[bool, typer.Option("--new-only", help="--fail-on counts only findings new or changed against the baseline (pre-commit, pull requests); default: new-only in the config.")] = False,
    all_findings: Annotated[bool, typer.Option("--all-findings", help="--fail-on counts every finding (overrides new-only: true in the config).")] = False,
    allow_unbound: Annotated[str | None, typer.Option("--allow-unbound", help="PKG[,PKG]: pinned kernel packages to review although they cannot be bound (their calls go unchecked, and every headline says so); default: allow-unbound in the config.")] = None,
    index_url: Annotated[str | None, typer.Option("--index-url", help="The package index (simple API) public bases of pinned vendor builds are read from (default: pip's configured index and find-links).")] = None,
    quiet: QuietOpt = False,
    color: ColorOpt = "auto",
) -> None:
    """Snapshot the port, trace, introspect, compare and check it, and write the reports."""
    from metax_audit.core.options import ReviewOptions

    formats = _formats(fmt)
    _terminal(color, quiet)
    mode = _mode(staged, worktree, rev, installed)
    _not_empty(upstream=upstream, base=base, python=python)
    with _Guard():
        gate = _gate_settings(repo, mode, config, upstream=upstream, base=base, stack=stack, python=python,
                              fail_on=fail_on, new_only=True if new_only else False if all_findings else None,
                              allow_unbound=allow_unbound)
    fail_on, new_only, cli_new_only = gate.values["fail_on"], gate.values["new_only"], new_only
    if fail_on not in ("error", "warning", "info", "never"):
        raise _fail(f"--fail-on must be error, warning, info or never (got {fail_on!r})")
    options = ReviewOptions(
        mode=mode, repo=repo, rev=rev, paths=tuple(paths or ()), upstream=gate.values["upstream"],
        base=gate.values["base"], stack=gate.values["stack"], python=gate.values["python"], config_file=config,
        waivers=waivers, test_command=test, run_probes=probe, baseline=baseline, merge_base=merge_base,
        no_baseline=no_baseline, no_cache=no_cache, index_url=index_url,
        # a flag only: the reviewed snapshot's own config says the rest (the pipeline reads it there)
        allow_unbound=gate.values["allow_unbound"] if allow_unbound is not None else None,
    )
    if sum(map(bool, (baseline, merge_base, no_baseline))) > 1:
        raise _fail("choose one of --baseline, --merge-base, --no-baseline")
    no_base = no_baseline or (rev is not None and not (baseline or merge_base))
    if new_only and no_base and not cli_new_only:
        # new-only from the config (the hook's setting) on a review without a baseline (a push's --rev):
        # every finding counts, the stricter gate, and the settings record says so
        new_only = False
        gate = _Gate(gate.values, gate.note.replace("new-only=True", "new-only=True ignored: no baseline, every finding counts"))
    if new_only and no_base:
        raise _fail("--new-only needs a baseline: --staged/--worktree compare with HEAD; with --rev pass --baseline REV "
                    "or --merge-base BRANCH")
    _review_and_render(options, formats, output_dir, fail_on, generate_waivers, new_only=new_only, settings=gate.note,
                       quiet=quiet)


@dataclass(frozen=True)
class _Gate:
    values: dict[str, Any]  # GATE_SETTINGS name -> the value the review uses
    note: str  # "fail-on=error (.metax-audit.yaml); ...": kept as the report's "settings" stage


def _gate_settings(repo: Path | None, mode: SnapshotMode | None, config_file: Path | None, **flags: Any) -> _Gate:
    """The gate's settings (config.GATE_SETTINGS): each flag given, else the config's setting, else the
    default; and the note the report keeps of where each came from."""
    from metax_audit.core.config import AuditConfig, config_origin
    from metax_audit.stages.snapshot import export_config, find_repo

    try:
        config = export_config(repo, mode or "staged", config_file)
        top = find_repo(repo or Path.cwd()) if config_file is None else Path(".")
    except AuditError:
        config, top = AuditConfig(), Path(".")  # not a repository: the review itself says so
    origin = config_origin(top, config_file) or "the config"
    defaults: dict[str, Any] = {"fail_on": "error", "new_only": False, "allow_unbound": None}
    values: dict[str, Any] = {}
    said: list[str] = []
    for name, flag in flags.items():
        setting = getattr(config, name)
        if name == "allow_unbound":
            flag = tuple(p.strip() for p in flag.split(",") if p.strip()) if flag is not None else None
            setting = setting or None
        if flag is not None:
            values[name], where = flag, f"--{name.replace('_', '-')}"
        elif setting is not None:
            values[name], where = setting, origin
            if name == "stack":
                values[name] = top / setting  # repo-relative in the config
        else:
            values[name], where = defaults.get(name), "default"
        if values[name] is not None or where != "default":
            shown = ",".join(values[name]) if isinstance(values[name], tuple) else values[name]
            said.append(f"{name.replace('_', '-')}={shown} ({where})")
    return _Gate(values, "; ".join(said))


def _review_and_render(options, formats, output_dir, fail_on, generate_waivers, *, exit_zero: bool = False,  # type: ignore[no-untyped-def]
                       new_only: bool = False, settings: str = "", quiet: bool = False) -> None:
    import time

    started = _started[0] if _started else time.perf_counter()  # in-process (CliRunner): from the command
    with _Guard():
        from metax_audit.cli.outdir import default_output_dir, ensure_writable
        from metax_audit.core.pysource import frozen_heap
        from metax_audit.pipeline.review import review as run_review
        from metax_audit.report import FORMATS, replace_file, write_reports_timed
        from metax_audit.stages.inventory import exit_code, summary_line

        files = tuple(f for f in formats if f in FORMATS)
        # Never inside the audited checkout by default; checked before the review.
        out = ensure_writable(output_dir or default_output_dir(options.repo, options.mode, options.rev)) if files else None
        result = run_review(options, _progress(quiet), generate_waivers=generate_waivers is not None)
        report = result.report
        if settings:  # where each setting of the gate came from (flag, config, default), kept in every report
            from dataclasses import replace

            from metax_audit.core.models import StageRecord

            report = replace(report, stages=(StageRecord("settings", True, 0.0, settings), *report.stages))
        # the stated wall time is the real one: from the process's start to the last report rendered
        written: list[Path] = []
        if out is not None:
            with frozen_heap():  # the review's live objects need no more collecting
                report, written = write_reports_timed(report, out, files, started)
        if generate_waivers is not None and result.generated_waivers is not None:
            replace_file(generate_waivers, result.generated_waivers)
            written.append(generate_waivers)
    from metax_audit.cli.render import render_counts, render_finding_lines, render_review_summary

    text = "text" in formats
    if out is not None and not quiet:  # the first line, once the reports are there (stderr under --format text)
        real = Path(os.path.realpath(out))
        # a symlinked --output-dir is followed on purpose (the user named it), and said so
        linked = f" (a symlink: written into {real})" if real != Path(os.path.abspath(out)) else ""
        typer.echo(f"reports: {out / 'summary.md' if 'md' in files else out}{linked}", err=text)
    if text:  # stdout is the findings' lines, for editors and grep; the first screen is in summary.md
        render_finding_lines(report)
    else:
        render_review_summary(report, written)
    if "github" in formats:  # annotations for the pull request, on stdout where the runner reads them
        from metax_audit.report.github import workflow_commands

        for line in workflow_commands(report):
            typer.echo(line)
    render_counts(summary_line(report))
    with _Guard():
        code = exit_code(report, fail_on, new_only=new_only)
    if new_only:  # the verdict counts every finding; say what the gate counted
        typer.echo(f"gate: --fail-on {fail_on} counts findings new or changed against the baseline only: exit {code}", err=True)
    raise typer.Exit(EXIT_CLEAN if exit_zero else code)


@app.command()
def trace(
    backend: Annotated[str, typer.Argument(help="Registered backend name, e.g. FLASHINFER (case-insensitive), or 'all'.")],
    staged: ModeStaged = False,
    worktree: ModeWorktree = False,
    rev: ModeRev = None,
    repo: RepoOpt = None,
    upstream: UpstreamOpt = None,
    config: ConfigOpt = None,
    fmt: TextFormatOpt = "text",
    color: ColorOpt = "auto",
) -> None:
    """Print the traced chain of one backend: registration -> builder -> impl -> wrapper -> kernel."""
    from metax_audit.pipeline.commands import trace_only

    json_out = _text_or_json(fmt, False)
    _terminal(color)
    mode = _mode(staged, worktree, rev)
    _not_empty(upstream=upstream)
    with _Guard():
        chains = trace_only(mode=mode, repo=repo, rev=rev, upstream=upstream, backend=backend, config=config)
    from metax_audit.cli.render_trace import chain_to_dict, chain_tree

    if json_out:
        typer.echo(json.dumps([chain_to_dict(c) for c in chains], indent=2))
        return
    from metax_audit.cli.render import render_trees

    render_trees([chain_tree(c) for c in chains])


@app.command()
def probe(
    backend: Annotated[str | None, typer.Option("--backend", help="Probe the kernels this backend calls (e.g. flashinfer).")] = None,
    target: Annotated[str | None, typer.Option("--target", help="A callable MOD:CALLABLE following a family's calling convention.")] = None,
    family: Annotated[str | None, typer.Option("--family", help="The kernel family of --target (paged-decode, paged-prefill, ragged-prefill, merge-states, h2o-scores).")] = None,
    probes: Annotated[str, typer.Option("--probes", help="Comma list of probes (default: all that apply).")] = "",
    device: Annotated[str, typer.Option("--device", help="auto | cuda | cpu")] = "auto",
    python: PythonOpt = None,
    output_dir: Annotated[Path | None, typer.Option("--output-dir", help="Where probe reports go (default: a directory per backend or target under the metax-audit cache, outside the checkout).")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds per probe subprocess.")] = 300.0,
    world_size: Annotated[int, typer.Option("--world-size", help="dcp across N real ranks (torch.distributed: NCCL on GPUs, gloo on CPU); 0: simulated on one device.")] = 0,
    color: ColorOpt = "auto",
) -> None:
    """Run discriminating probes (lse, layout, fp8-scale, dcp, query-count, padding, graph-capture, h2o)."""
    from metax_audit.pipeline.commands import probe as run_probe

    _terminal(color)
    if bool(backend) == bool(target):
        raise _fail("give exactly one of --backend NAME or --target MOD:CALLABLE (with --family)")
    if target and not family:
        raise _fail("--target needs --family (see `metax-audit probe --help`)")
    with _Guard():
        from metax_audit.cli.outdir import default_probe_output_dir, ensure_writable

        out = ensure_writable(output_dir or default_probe_output_dir(backend or target or "probe"))
        results, written = run_probe(backend=backend, target=target, family=family,
                                     probes=tuple(p for p in probes.split(",") if p), device=device,
                                     python=python, output_dir=out, timeout=timeout,
                                     options={"world_size": str(world_size)} if world_size else None)
    from metax_audit.cli.render import render_probe_results

    render_probe_results(results, written)
    bad = [r for r in results if r.verdict in ("mismatch", "error")]
    raise typer.Exit(EXIT_FINDINGS if bad else EXIT_CLEAN)


@app.command()
def evidence(
    capture_stack: Annotated[Path | None, typer.Option("--capture-stack", help="Also write a stack manifest of the traced kernel entry points (of the port snapshot chosen as for review).")] = None,
    save: Annotated[Path | None, typer.Option("--save", help="Save the environment record; an existing one is compared first.")] = None,
    staged: ModeStaged = False,
    worktree: ModeWorktree = False,
    rev: ModeRev = None,
    repo: RepoOpt = None,
    upstream: UpstreamOpt = None,
    python: PythonOpt = None,
    config: ConfigOpt = None,
    fmt: TextFormatOpt = "text",
    as_json: JsonAliasOpt = False,
    color: ColorOpt = "auto",
) -> None:
    """Record device, driver, torch/Triton build, CUDA or MACA runtime and kernel package versions."""
    from metax_audit.pipeline.commands import evidence as run_evidence

    _not_empty(upstream=upstream, python=python)
    json_out = _text_or_json(fmt, as_json)
    _terminal(color)
    with _Guard():
        env, changes, manifest = run_evidence(python=python, save=save, capture_stack=capture_stack, repo=repo,
                                              mode=_mode(staged, worktree, rev), rev=rev, upstream=upstream,
                                              config=config)
    from metax_audit.cli.render import render_evidence

    render_evidence(env, changes, manifest, json_out)


@app.command()
def contracts(
    check: Annotated[bool, typer.Option("--check", help="Rerun each observation's probe here: confirmed, contradicted or not checkable.")] = False,
    file: Annotated[Path | None, typer.Option("--file", help="Contracts file (default: component-contracts.md of this project).")] = None,
    python: PythonOpt = None,
    fmt: TextFormatOpt = "text",
    as_json: JsonAliasOpt = False,
    color: ColorOpt = "auto",
) -> None:
    """List the component contracts and their versioned observations; --check re-verifies them."""
    from metax_audit.pipeline.commands import contracts as run_contracts

    json_out = _text_or_json(fmt, as_json)
    _terminal(color)
    with _Guard():
        contracts_obj, checks = run_contracts(path=file, check=check, python=python)
    from metax_audit.cli.render import render_contracts

    render_contracts(contracts_obj, checks, json_out)
    if check and any(c.status == "contradicted" for c in checks):
        raise typer.Exit(EXIT_FINDINGS)


@app.command()
def rule(
    rule_id: Annotated[str, typer.Argument(metavar="RULE", help="A rule id, e.g. MXA101 (see `metax-audit rules`).")],
    color: ColorOpt = "auto",
) -> None:
    """What a rule means, what makes it an error, a warning or info (with examples), how to waive it."""
    from metax_audit.report.rules_doc import explain

    _terminal(color)
    found = explain(rule_id)
    if found is None:
        raise _fail(f"no rule {rule_id!r} (`metax-audit rules` lists them)")
    from metax_audit.cli.render import render_rule

    render_rule(found)


@app.command()
def rules(color: ColorOpt = "auto") -> None:
    """Every rule: id, category, default severity and what it means (docs/rules.md has the same table)."""
    from metax_audit.report.rules_doc import load_all_rules

    _terminal(color)
    from metax_audit.cli.render import render_rules

    render_rules(tuple(load_all_rules().values()))


@app.command()
def demo(
    output_dir: Annotated[Path, typer.Option("--output-dir", help="Where the demo's reports go.")] = Path("reports/demo"),
    keep: Annotated[Path | None, typer.Option("--keep", help="Build the demo repo here and keep it (default: a temp dir).")] = None,
    quiet: QuietOpt = False,
    color: ColorOpt = "auto",
) -> None:
    """Build the bundled demo port as a git repo with staged changes and review it end to end."""
    from metax_audit import demo as demo_mod
    from metax_audit.core import tempdirs
    from metax_audit.core.options import ReviewOptions

    _terminal(color, quiet)
    with _Guard():
        holder = tempdirs.make("demo") if keep is None else keep
        repo = demo_mod.build_demo_repo(holder / "vllm-metax-demo" if keep is None else keep)
        typer.echo(f"demo port repo: {repo} (one commit, staged + unstaged + untracked changes)", err=True)
    options = ReviewOptions(
        mode="staged", repo=repo, upstream=str(demo_mod.upstream_root()),
        extra_path=(demo_mod.stack_root(),), run_probes=False,
    )
    try:
        _review_and_render(options, ("md", "json", "sarif", "junit"), output_dir, "never", None, exit_zero=True, quiet=quiet)
    finally:
        if keep is None:
            from metax_audit.core import fstree

            fstree.rmtree(holder, ignore_errors=True)


def main() -> None:
    # Non-TTY and CI runs stay quiet and plain; rich only decorates an interactive terminal.
    if os.environ.get("CI"):
        os.environ.setdefault("NO_COLOR", "1")
    from metax_audit.core.clock import process_started

    _started[:] = [process_started()]
    _state["main"] = True
    _guard_streams()
    _collect_garbage_rarely()
    empty = _empty_path_option(sys.argv[1:])
    if empty is not None:  # Path("") is Path("."): an empty --output-dir would write into the cwd (the checkout)
        _fail(f"{empty} is empty; give a path")
        _exit_now(EXIT_CANNOT_AUDIT)
    try:
        call = _plain_review_call(sys.argv[1:])
        if call is None:
            app()
        else:
            _run_plain_review(call)
    except KeyboardInterrupt:  # one that came before a command's guard was entered
        sys.exit(_interrupted("metax-audit: interrupted"))
    except SystemExit as done:  # how every command ends (typer's standalone mode)
        # under a profiler or tracer (cProfile, coverage) it writes its results once main() returns
        if (done.code is None or isinstance(done.code, int)) and sys.getprofile() is None and sys.gettrace() is None:
            _exit_now(done.code or 0)
        raise


class _TolerantStream:
    """stdout or stderr that a closed pipe (`| head -1`), a full disk or a closed descriptor cannot
    break: the first failed write or flush turns it into a sink, so the exit code stays the
    review's (the reports are files; what the terminal misses they still hold)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._broken = stream is None

    def write(self, text: str) -> int:
        if not self._broken:
            try:
                return int(self._stream.write(text))
            except (OSError, ValueError):
                self._broken = True
        return len(text)

    def flush(self) -> None:
        if not self._broken:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self._broken = True

    def isatty(self) -> bool:
        if self._broken:
            return False
        try:
            return bool(self._stream.isatty())
        except (OSError, ValueError):
            return False

    def fileno(self) -> int:
        if self._stream is None:
            raise OSError("stream closed")
        return int(self._stream.fileno())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _guard_streams() -> None:
    """A descriptor 0, 1 or 2 that the caller closed (`>&-`, `2>&-`) is opened on /dev/null first:
    otherwise the next file this process opens takes its number, and whatever is written to
    "stdout" (by us or a child) lands in that file. Python leaves sys.stdout None then; both
    streams become _TolerantStream, so a write can never raise or change the exit code."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            try:
                null = os.open(os.devnull, os.O_RDWR)
            except OSError:
                continue
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if not isinstance(sys.stdout, _TolerantStream):
        sys.stdout = _TolerantStream(sys.stdout)  # type: ignore[assignment]
    if not isinstance(sys.stderr, _TolerantStream):
        sys.stderr = _TolerantStream(sys.stderr)  # type: ignore[assignment]


# Options whose value is a path: typer turns "" into Path("."), so an empty one (an unset CI
# variable) is refused before parsing, as _not_empty refuses the others.
_PATH_OPTIONS = ("--output-dir", "--config", "--waivers", "--stack", "--repo", "--generate-waivers", "--save",
                 "--capture-stack", "--contracts")


def _empty_path_option(argv: Sequence[str]) -> str | None:
    """The first path option in `argv` given an empty (or blank) value, else None."""
    for i, word in enumerate(argv):
        if word == "--":
            return None
        name, eq, value = word.partition("=")
        if name not in _PATH_OPTIONS:
            continue
        if eq:
            if not value.strip():
                return name
        elif i + 1 < len(argv) and not argv[i + 1].strip():
            return name
    return None


def _collect_garbage_rarely() -> None:
    """A review builds syntax trees and keeps them to its end: nearly every object it allocates lives
    on, so the collector's default pace (a young collection every 700 allocations, promoting the
    same trees again and again) found nothing to free and was half the time of parsing (300 upstream
    files: 2.1 s of CPU at the default pace, 0.83 s with this one; a cold review of the real port
    8.8 -> 7.1 s, peak memory unchanged). Cycles are still collected, every 50,000 allocations; what
    is alive now (the imported modules) is left out of every later collection."""
    import gc

    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def _plain_review_call(argv: Sequence[str]) -> dict[str, Any] | None:
    """The keyword arguments typer would pass to review() for a plain `review` command line (long
    options, each value a word of its own, positional paths), read from review()'s own declarations;
    None for anything else (--help, a root option, a short, unknown or --opt=value option, a value
    that starts with '-', an option of a kind not read here), which typer parses. Typer converts
    every valued option through a pydantic adapter: importing pydantic and building them took 0.13 s
    of every review."""
    if not argv or argv[0] != "review":
        return None
    import inspect
    import typing

    from typer.models import ArgumentInfo, OptionInfo

    hints = typing.get_type_hints(review, include_extras=True)
    call: dict[str, Any] = {}
    options: dict[str, tuple[str, Callable[[str], Any] | None]] = {}  # --name -> (parameter, converter; None: a flag)
    positional: str | None = None
    for name, param in inspect.signature(review).parameters.items():
        kind, info = typing.get_args(hints[name])[:2]
        call[name] = param.default
        if isinstance(info, ArgumentInfo) and kind == list[str] | None and positional is None:
            positional = name
            continue
        if not isinstance(info, OptionInfo) or info.param_decls or info.callback or info.envvar or info.parser:
            return None
        decl = info.default
        known = {bool: None, str: str, str | None: str, Path: Path, Path | None: Path}
        if not (isinstance(decl, str) and decl.startswith("--") and "/" not in decl) or kind not in known:
            return None
        options[decl] = (name, known[kind])
    paths: list[str] = []
    words = iter(argv[1:])
    for word in words:
        if word in options:
            name, convert = options[word]
            if convert is None:
                call[name] = True
                continue
            value = next(words, None)
            if value is None or value.startswith("-"):
                return None
            call[name] = convert(value)
        elif word.startswith("-") or positional is None:
            return None
        else:
            paths.append(word)
    if positional is not None:
        call[positional] = paths or None
    try:
        _formats(call.get("fmt", ""))
    except typer.BadParameter:
        return None  # typer says it, with the usage line
    return call


def _run_plain_review(call: dict[str, Any]) -> None:
    """review(**call) ended as typer's standalone mode ends a command."""
    import errno

    try:
        review(**call)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except KeyboardInterrupt as exc:
        raise typer.Exit(130) from exc
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise
        sys.exit(1)
    sys.exit(EXIT_CLEAN)


def _exit_now(code: int) -> None:
    """End the process with `code` once the work is done, without the interpreter's teardown: a
    review leaves millions of live objects (syntax trees, caches) whose one-by-one deallocation
    took 0.15-0.3 s after the last report was written. What a normal exit would still run runs
    first: non-daemon threads finish, atexit handlers run, stdout and stderr are flushed."""
    import atexit
    import threading

    threading._shutdown()  # type: ignore[attr-defined]  # as Py_Finalize: its thread hooks, then a join
    atexit._run_exitfuncs()
    import contextlib

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):  # a closed pipe (| head), a closed fd (None)
            stream.flush()
    os._exit(code)
