# The probe stage: runs each probe of the top-level `probes` package in its own subprocess (so a
# crashing or hanging kernel is a recorded result), maps backends/traces to targets, and files findings.
from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from metax_audit.config import AuditConfig
from metax_audit.errors import ProbeError
from metax_audit.findings import make_finding, rule
from metax_audit.models import BackendChain, Category, Finding, Location, ProbeResult, Severity

MARKER = "PROBE-OUTCOME "
READY = "PROBE-READY "
_PROBES_ROOT = Path(__file__).resolve().parent.parent  # the directory holding the `probes` package
DEFAULT_PORT = (AuditConfig.port_package,)  # what a probe worker never imports unless told otherwise

BUILTIN_PROBES = ("lse", "layout", "fp8-scale", "dcp", "query-count", "padding", "graph-capture")
BUILTIN_FAMILIES = ("paged-decode", "paged-prefill", "ragged-prefill", "merge-states", "dcp-local-seq-lens")


def _discover() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Probes and families the `probes` package provides (h2o joins when present); the built-in
    lists when the package cannot be imported here (it runs in the target interpreter anyway)."""
    try:
        from probes.registry import registry

        reg = registry()
        probes = tuple(dict.fromkeys((*BUILTIN_PROBES, *reg.probes)))
        families = tuple(dict.fromkeys((*BUILTIN_FAMILIES, *reg.families)))
        return probes, families
    except Exception:
        return BUILTIN_PROBES, BUILTIN_FAMILIES


PROBES, FAMILIES = _discover()

# Which probes apply to which family (the CLI's default probe list for a target).
APPLIES: dict[str, tuple[str, ...]] = {
    "paged-decode": ("lse", "layout", "fp8-scale", "dcp", "padding", "graph-capture"),
    "paged-prefill": ("lse", "layout", "fp8-scale", "query-count", "padding"),
    "ragged-prefill": ("lse", "layout", "fp8-scale", "query-count", "padding"),
    "merge-states": ("lse", "dcp"),
    "dcp-local-seq-lens": ("dcp",),
}



def applicable(family: str) -> tuple[str, ...]:
    """The probes that apply to a family: the built-in table, else what the probe modules declare
    (an add-on family such as h2o-scores)."""
    if family in APPLIES:
        return APPLIES[family]
    try:
        from probes.registry import registry

        return tuple(n for n, p in registry().probes.items() if family in p.families)
    except Exception:
        return ()


_BACKENDS: dict[str, list[tuple[str, str]]] = {
    "flashinfer": [
        ("flashinfer:BatchDecodeWithPagedKVCacheWrapper", "paged-decode"),
        ("flashinfer:BatchPrefillWithPagedKVCacheWrapper", "paged-prefill"),
        ("flashinfer:BatchPrefillWithRaggedKVCacheWrapper", "ragged-prefill"),
        ("flashinfer:merge_state", "merge-states"),
    ],
    "torch-reference": [
        ("torch-reference", "paged-decode"),
        ("torch-reference", "paged-prefill"),
        ("torch-reference", "ragged-prefill"),
        ("torch-reference:base-e", "merge-states"),
        ("torch-reference", "dcp-local-seq-lens"),
    ],
}
_NO_ADAPTER = {
    "triton": "vLLM's Triton attention ops have no built-in adapter yet; probe one with --target MOD:CALLABLE --family paged-decode",
    "flash_attn": "flash-attn has no built-in adapter yet; probe it with --target MOD:CALLABLE --family ragged-prefill",
}

# Resolved callee name (suffix) -> (built-in target, family), for targets_from_trace.
_TRACE_MAP = (
    ("BatchDecodeWithPagedKVCacheWrapper", _BACKENDS["flashinfer"][0]),
    ("BatchPrefillWithPagedKVCacheWrapper", _BACKENDS["flashinfer"][1]),
    ("BatchPrefillWithRaggedKVCacheWrapper", _BACKENDS["flashinfer"][2]),
    ("flashinfer.merge_state", _BACKENDS["flashinfer"][3]),
    ("flashinfer.cascade.merge_state", _BACKENDS["flashinfer"][3]),
)

# ---------------------------------------------------------------- rules (MXA400-MXA449)

_CATEGORY = {
    "lse": Category.LSE, "layout": Category.LAYOUT, "fp8-scale": Category.FP8_SCALE, "dcp": Category.DCP,
    "query-count": Category.QUERY_COUNT, "padding": Category.PADDING, "graph-capture": Category.GRAPH_CAPTURE,
}
_MISMATCH_RULE = {"lse": "MXA400", "layout": "MXA401", "fp8-scale": "MXA402", "dcp": "MXA403", "query-count": "MXA404",
                  "padding": "MXA405", "graph-capture": "MXA406"}
_ERROR_RULE = {"lse": "MXA410", "layout": "MXA411", "fp8-scale": "MXA412", "dcp": "MXA413", "query-count": "MXA414",
               "padding": "MXA415", "graph-capture": "MXA416"}
_HELP_MISMATCH = {
    "lse": "The kernel's LSE is not in the base or layout that was expected (the convention's base e, [tokens, heads], or what the target declares). A consumer that merges partial results (cascade, DCP, chunked prefill) with the other base silently mixes wrong weights. Convert at the call site or declare the base.",
    "layout": "The kernel read the KV cache in another layout than it was told (NHD vs HND), or ignored the strides of a view into a joint [N, 2, ...] allocation. Pass the layout the cache really has, or make the cache contiguous.",
    "fp8-scale": "With an FP8 KV cache and k_scale=2, v_scale=0.25, the output matched scales that were ignored, inverted, swapped or applied twice. Check how the call site passes k_scale/v_scale and whether the kernel already folds them in.",
    "dcp": "Partial attention over interleaved KV shards, merged with the given merge function, is not full attention: the producer's LSE base and the merger's assumed base differ, or the per-rank lengths are wrong. Convert the LSE before merging or use the matching merge.",
    "query-count": "With mixed query lengths in one batch the output matched another causal alignment (top-left or none) than bottom-right. Check qo_indptr/causal arguments at the call site.",
    "padding": "Padded requests (zero length, -1 block-table holes) changed real outputs, or padded heads were returned as real heads.",
    "graph-capture": "After capture, in-place changes of inputs and metadata and a replay, the output did not follow the new inputs: the target captured a stale pointer or a host-side value (e.g. a sequence length).",
}
for _p, _rid in _MISMATCH_RULE.items():
    rule(_rid, _CATEGORY[_p], Severity.ERROR, f"kernel semantics differ from the expected {_p} hypothesis (probe mismatch)", _HELP_MISMATCH[_p])
for _p, _rid in _ERROR_RULE.items():
    rule(_rid, _CATEGORY[_p], Severity.WARNING, f"the {_p} probe could not finish: the target raised, crashed or hung",
         "The probe ran in its own subprocess and the target raised an exception, died (signal) or timed out. The traceback or stderr tail is the evidence; until it runs, the semantics it checks are unvalidated.")
rule("MXA407", Category.COVERAGE, Severity.ERROR, "kernel semantics differ from the expected hypothesis of an add-on probe",
     "A probe outside the built-in set (e.g. h2o) found a mismatch; its per-hypothesis errors are the evidence.")
rule("MXA417", Category.COVERAGE, Severity.WARNING, "an add-on probe could not finish: the target raised, crashed or hung",
     "As MXA410-MXA416, for a probe outside the built-in set.")
rule("MXA420", Category.COVERAGE, Severity.INFO, "probe not checkable: the target lacks a control the probe needs",
     "The target's signature has no way to ask for what the probe needs (no LSE return, no scale argument, no layout switch). The probe failed closed; the contract stays unvalidated. The inspected signature is the evidence.")


# ---------------------------------------------------------------- running


def run_probes(
    *,
    target: str,
    family: str | None,
    probes: Sequence[str],
    device: str = "auto",
    timeout: float = 300,
    python: str | None = None,
    extra_path: Sequence[Path] = (),
    options: Mapping[str, str] | None = None,
    port_packages: Sequence[str] = DEFAULT_PORT,
) -> list[ProbeResult]:
    """Run probes on `target`, all in one worker subprocess (`python -m probes worker`).

    `family` may be None for a built-in target name that belongs to exactly one family. An
    empty `probes` means every probe that applies to the family. `python` is the target
    interpreter (default: this one); `extra_path` is prepended to its PYTHONPATH (after the
    directory holding `probes`). A crash, non-JSON output or a timeout is an `error` result for
    that probe; the worker is restarted for the next one. The worker never imports the port
    (`port_packages`) unless the target is the port's own code (port_fence)."""
    fam, jobs = _jobs(target, family, probes, options)
    return run_jobs(target, fam, jobs, device=device, timeout=timeout, python=python, extra_path=extra_path,
                    port_packages=port_packages)


def run_targets(pairs: Sequence[tuple[str, str]], *, probes: Sequence[str], device: str = "auto", timeout: float = 300,
                python: str | None = None, options: Mapping[str, str] | None = None,
                port_packages: Sequence[str] = DEFAULT_PORT) -> list[ProbeResult]:
    """run_probes for several (target, family) pairs, one worker each (side by side on a GPU);
    `options` go to every probe (e.g. world_size for dcp across real ranks)."""
    groups = [(t, *_jobs(t, f or None, probes, options)) for t, f in pairs]
    return run_many(groups, device=device, timeout=timeout, python=python, strict=True, port_packages=port_packages)


def port_fence(target: str, port_packages: Sequence[str]) -> tuple[str, ...] | None:
    """The packages the worker of `target` must never import (subproc.fenced): the port's, unless the
    target is the port's own code, which the user asked to run: a port-* built-in (its op file loaded
    from the port's source tree), a module of the port, or a file the target names by path (None)."""
    module = target.split(":", 1)[0]
    if target.startswith("port-") or module.endswith(".py") or "/" in module or module.split(".")[0] in port_packages:
        return None
    return tuple(port_packages)


def _jobs(target: str, family: str | None, probes: Sequence[str], options: Mapping[str, str] | None) -> tuple[str, list[tuple[str, dict[str, str]]]]:
    fam = family or _family_of(target)
    if fam not in FAMILIES:
        raise ProbeError(f"unknown kernel family {fam!r}; known: {', '.join(FAMILIES)}")
    unknown = [p for p in probes if p not in PROBES]
    if unknown:
        raise ProbeError(f"unknown probe(s) {', '.join(unknown)}; known: {', '.join(PROBES)}")
    return fam, [(p, dict(options or {})) for p in (list(probes) or list(applicable(fam)))]


NO_DEVICE = "no CUDA device here"
# Built-in targets that only run on a CUDA device (a JIT-built or Triton kernel).
_CUDA_TARGET_PREFIXES = ("flashinfer:", "vllm-triton:", "port-triton:")
_CUDA_DEVICE_NODES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/kfd", "/dev/mxcd")


def cuda_device_present() -> bool:
    """A CUDA-capable device node exists (NVIDIA, ROCm or MetaX): checked without importing torch."""
    import glob

    return any(os.path.exists(p) for p in _CUDA_DEVICE_NODES) or bool(glob.glob("/dev/nvidia[0-9]*"))


def needs_cuda(target: str, probe: str, options: Mapping[str, str]) -> bool:
    """Whether this probe of this target can only run on a CUDA device."""
    if target.startswith(_CUDA_TARGET_PREFIXES):
        return True
    return probe == "graph-capture" and options.get("simulate") != "1"


def run_jobs(target: str, family: str, jobs: Sequence[tuple[str, Mapping[str, str]]], *, device: str = "auto",
             timeout: float = 300, python: str | None = None, extra_path: Sequence[Path] = (),
             strict: bool = False, port_packages: Sequence[str] = DEFAULT_PORT) -> list[ProbeResult]:
    """Every (probe, options) job of one target in one worker process. Without a CUDA device, jobs
    that need one are skipped here, before any process starts. A target that cannot be loaded is a
    ProbeError when `strict` (the probe command: one line, exit 2), else an `error` result per job
    (a review probing the targets its flows name carries on)."""
    on_cpu = device == "cpu" or (not cuda_device_present() and device in ("auto", "cuda"))
    results: dict[int, ProbeResult] = {}
    todo = []
    for i, (probe, opts) in enumerate(jobs):
        if on_cpu and needs_cuda(target, probe, opts):
            results[i] = ProbeResult(probe, family, target, "skipped", skipped_reason=f"{NO_DEVICE}: {target} {probe} needs one",
                                     details={"rerun": _rerun(probe, family, target, opts), "category": _category_name(probe),
                                              "no_device": True, **({"options": dict(opts)} if opts else {})})
        else:
            todo.append(i)
    if todo:
        env = {"PYTHONPATH": os.pathsep.join([str(_PROBES_ROOT), *map(str, extra_path), *filter(None, [os.environ.get("PYTHONPATH")])]),
               "PYTHONUNBUFFERED": "1"}
        with _Worker(python or sys.executable, target, family, device, env, timeout, strict,
                     port_fence(target, port_packages)) as worker:
            for i in todo:
                probe, opts = jobs[i]
                results[i] = worker.ask(probe, opts)
    return [results[i] for i in range(len(jobs))]


def run_many(groups: Sequence[tuple[str, str, Sequence[tuple[str, Mapping[str, str]]]]], *, device: str = "auto",
             timeout: float = 300, python: str | None = None, extra_path: Sequence[Path] = (), parallel: int | None = None,
             on_result: Any = None, strict: bool = False, port_packages: Sequence[str] = DEFAULT_PORT) -> list[ProbeResult]:
    """run_jobs for several targets, one worker each. On a CUDA machine the workers run side by side
    (`parallel`, default up to 4: start-up, JIT loads and CPU-side references overlap); on CPU one
    at a time. Results come back in the order asked; `on_result(r)` sees each as it finishes."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    gpu = device != "cpu" and cuda_device_present()
    n = parallel or (min(4, len(groups)) if gpu else 1)
    lock = threading.Lock()

    def one(group: tuple[str, str, Sequence[tuple[str, Mapping[str, str]]]]) -> list[ProbeResult]:
        tgt, fam, jobs = group
        rs = run_jobs(tgt, fam, jobs, device=device, timeout=timeout, python=python, extra_path=extra_path, strict=strict,
                      port_packages=port_packages)
        if on_result is not None:
            with lock:
                for r in rs:
                    on_result(r)
        return rs

    if n <= 1:
        return [r for g in groups for r in one(g)]
    with ThreadPoolExecutor(max_workers=n) as pool:
        return [r for rs in pool.map(one, groups) for r in rs]


def probe_line(r: ProbeResult) -> str:
    """One whole line per result (logs, non-terminal output): never cut, every field named."""
    we = "" if r.worst_error is None else f"{r.worst_error:.3g}"
    opts = r.details.get("options") or {}
    extra = f" options={','.join(f'{k}={v}' for k, v in opts.items())}" if opts else ""
    why = f" reason={r.skipped_reason}" if r.skipped_reason else ""
    return (f"{r.verdict} probe={r.probe} family={r.family} target={r.target} matched={r.matched or '-'} "
            f"expected={r.expected or '-'} worst={we or '-'}{extra}{why}")


class _Worker:
    """One `python -m probes worker` process for one target; restarted after a crash or hang."""

    def __init__(self, python: str, target: str, family: str, device: str, env: Mapping[str, str], timeout: float,
                 strict: bool, never_import: tuple[str, ...] | None = None) -> None:
        self._strict = strict
        self._never_import = never_import
        self._unloadable: str | None = None
        self._args = ["-m", "probes", "worker", "--family", family, "--target", target, "--device", device]
        self._python, self._env, self._timeout = python, dict(env), timeout
        self._target, self._family = target, family
        self._proc: Any = None
        self._cwd: Path | None = None

    def __enter__(self) -> _Worker:
        from metax_audit import tempdirs

        self._cwd = tempdirs.make("cwd")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()
        if self._cwd is not None:
            import shutil

            shutil.rmtree(self._cwd, ignore_errors=True)

    def _start(self) -> str | None:
        """Start the process and wait for its ready line; None when ready, else why not."""
        import contextlib
        import queue
        import tempfile
        import threading

        from metax_audit.subproc import spawn_python

        assert self._cwd is not None
        self._stderr = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")  # noqa: SIM115 (closed in _stop)
        self._proc = spawn_python(self._python, self._args, cwd=self._cwd, env=self._env, stderr=self._stderr,
                                  never_import=self._never_import)
        self._lines: queue.Queue[str | None] = queue.Queue()

        def pump(stream: Any, sink: queue.Queue[str | None]) -> None:
            with contextlib.suppress(OSError, ValueError):  # closed by _stop()
                for line in stream:
                    sink.put(line)
            sink.put(None)

        threading.Thread(target=pump, args=(self._proc.stdout, self._lines), daemon=True).start()
        line = self._next(self._timeout, READY)
        if line is None:
            return self._why()
        ready = json.loads(line[len(READY):])
        if not ready.get("loaded"):
            self._stop()
            self._unloadable = f"target {self._target} ({self._family}) cannot be loaded: {ready.get('error')}"
            if self._strict:
                raise ProbeError(self._unloadable)
            return self._unloadable
        return None

    def _next(self, timeout: float, marker: str) -> str | None:
        import queue
        import time

        end = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                self._timed_out = True
                return None
            if line is None:
                return None
            if line.startswith(marker):
                return line

    def _why(self) -> str:
        if getattr(self, "_timed_out", False):
            return f"timed out after {self._timeout:g}s (hung kernel or JIT build)"
        code = self._proc.wait()
        return f"probe worker exited with {code}" + (f" (signal {-code})" if code < 0 else "") + " before printing a result"

    def ask(self, probe: str, opts: Mapping[str, str]) -> ProbeResult:
        rerun = _rerun(probe, self._family, self._target, opts)
        self._timed_out = False
        why = self._unloadable or (self._start() if self._proc is None else None)
        if self._unloadable:
            return ProbeResult(probe, self._family, self._target, "error", skipped_reason=self._unloadable,
                               details={"rerun": rerun, "category": _category_name(probe), **({"options": dict(opts)} if opts else {})})
        line = None
        if why is None:
            offset = self._stderr.tell()
            try:
                self._proc.stdin.write(json.dumps({"probe": probe, "options": dict(opts)}) + "\n")
                self._proc.stdin.flush()
            except OSError:
                pass  # it died: the missing outcome line says so
            line = self._next(self._timeout, MARKER)
            if line is None:
                why = self._why()
        else:
            offset = 0
        if line is None:
            tail = self._stderr_since(offset)
            self._stop()  # the next probe gets a fresh worker
            return ProbeResult(probe, self._family, self._target, "error", skipped_reason=why,
                               details={"stderr_tail": tail, "rerun": rerun, "category": _category_name(probe),
                                        **({"options": dict(opts)} if opts else {})})
        r = from_outcome(json.loads(line[len(MARKER):]), rerun=rerun)
        return replace(r, details={**r.details, "options": dict(opts)}) if opts else r

    def _stderr_since(self, offset: int) -> str:
        self._stderr.flush()
        self._stderr.seek(offset)
        text = self._stderr.read()
        self._stderr.seek(0, 2)
        return text[-2000:]

    def _stop(self) -> None:
        """End the worker and everything it started (its own process group); no process is left."""
        import contextlib
        import signal
        import subprocess

        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            proc.stdin.close()  # a live worker ends at end of input
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        with contextlib.suppress(OSError):  # gone already, or not ours
            os.killpg(proc.pid, signal.SIGKILL)  # the hung worker, and any JIT build it started
        proc.wait()
        with contextlib.suppress(OSError):
            proc.stdout.close()
        self._stderr.close()


def _rerun(probe: str, family: str, target: str, options: Mapping[str, str]) -> str:
    return f"python -m probes run --probe {probe} --family {family} --target {target}" + "".join(f" --option {k}={v}" for k, v in options.items())


def _family_of(target: str) -> str:
    owners = [fam for fam, pairs in _families_by_target().items() if target in pairs]
    if len(owners) == 1:
        return owners[0]
    raise ProbeError(f"target {target!r} needs --family (one of {', '.join(FAMILIES)})")


def _families_by_target() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for pairs in _BACKENDS.values():
        for t, f in pairs:
            out.setdefault(f, set()).add(t)
    out.setdefault("paged-decode", set()).add("torch-sdpa")
    return out


def from_outcome(data: Mapping[str, Any], *, rerun: str = "") -> ProbeResult:
    """A `probes` outcome JSON as the pipeline's ProbeResult (the full record kept in details)."""
    dev = data.get("device") or {}
    device = dev.get("device", "?")
    if dev.get("gpu"):
        device += f": {dev['gpu']} (sm {dev.get('capability', '?')})"
    device += f", torch {dev.get('torch', '?')}"
    hyps = {h: _num(v.get("abs")) for h, v in (data.get("hypotheses") or {}).items()}
    reason = data.get("skipped_reason")
    return ProbeResult(
        probe=data["probe"], family=data["family"], target=data["target"], verdict=data["verdict"], matched=data.get("matched"),
        expected=data.get("expected"), hypotheses=hyps, worst_error=_num(data.get("worst_error")), device=device,
        skipped_reason=reason, details={**dict(data), "rerun": rerun, "category": _category_name(data["probe"])},
    )


def _num(x: Any) -> float | None:
    if x is None:
        return None
    return float(x)  # "inf" strings from the JSON become float('inf')


def _category_name(probe: str) -> str:
    return _CATEGORY[probe].value if probe in _CATEGORY else Category.COVERAGE.value


def backend_targets(backend: str) -> list[tuple[str, str]]:
    """(target, family) pairs with built-in adapters for a backend name (flashinfer,
    torch-reference; `FLASHINFER` and `flash-attn` spellings accepted)."""
    key = backend.strip().lower().replace("-", "_")
    key = {"torch_reference": "torch-reference", "flash_attention": "flash_attn", "flash_attn": "flash_attn"}.get(key, key)
    if key in _BACKENDS:
        return list(_BACKENDS[key])
    if key in _NO_ADAPTER:
        raise ProbeError(_NO_ADAPTER[key])
    raise ProbeError(f"no probe targets for backend {backend!r}; known: {', '.join([*_BACKENDS, *_NO_ADAPTER])}")


def targets_from_trace(chain: BackendChain) -> list[tuple[str, str]]:
    """The built-in targets a traced backend really calls (its resolved call sites and chain
    hops), in call order, each once; a chain calling no adapted kernel gives []."""
    names = [c.resolved for c in chain.calls if c.resolved] + [h.resolved or h.qualname for h in chain.chain]
    out: list[tuple[str, str]] = []
    for name in names:
        for suffix, pair in _TRACE_MAP:
            if (suffix in name) and pair not in out:
                out.append(pair)
    return out


# ---------------------------------------------------------------- findings


def probe_findings(results: Iterable[ProbeResult]) -> Iterator[Finding]:
    """A mismatch, an error (crash, hang, exception in the target) or a not-checkable result
    becomes a finding with the per-hypothesis errors and the device as evidence."""
    for r in results:
        loc = Location(path=f"probe:{r.target}", line=0, symbol=f"{r.probe}/{r.family}")
        ev = _evidence(r)
        if r.verdict == "mismatch":
            rid = _MISMATCH_RULE.get(r.probe, "MXA407")
            got = r.matched or "no hypothesis"
            yield make_finding(rid, loc, f"{r.target} ({r.family}) {r.probe}: matched {got!r}, expected {r.expected!r}", ev)
        elif r.verdict == "error":
            rid = _ERROR_RULE.get(r.probe, "MXA417")
            yield make_finding(rid, loc, f"{r.target} ({r.family}) {r.probe}: {r.skipped_reason}", ev)
        elif r.verdict == "not-checkable":
            yield make_finding("MXA420", loc, f"{r.target} ({r.family}) {r.probe} not checkable: {r.skipped_reason}", ev)


def _evidence(r: ProbeResult) -> list[str]:
    ev = [f"probe {r.probe} on {r.target} ({r.family}), device {r.device}"]
    if r.expected:
        ev.append(f"expected {r.expected}, matched {r.matched}")
    for h, e in sorted(r.hypotheses.items(), key=lambda kv: (kv[1] is None, kv[1] or 0.0)):
        ev.append(f"hypothesis {h}: worst abs error {e:.3g}" if e is not None else f"hypothesis {h}: no error recorded")
    for c in r.details.get("cases", ())[:4]:
        ev.append(f"case {c.get('name')}: matched {c.get('matched')}")
    ev += [str(x) for x in r.details.get("evidence", ())][:3]
    if r.details.get("stderr_tail"):
        ev.append("stderr tail: " + r.details["stderr_tail"][-400:])
    if r.details.get("rerun"):
        ev.append(f"rerun: {r.details['rerun']}")
    return ev


# ---------------------------------------------------------------- report (device runs)


def render_markdown(results: Sequence[ProbeResult], environment: Mapping[str, Any] | None = None, title: str = "Probe report") -> str:
    lines = [f"# {title}", ""]
    if environment:
        lines += ["## Environment", ""]
        for k in ("gpu", "gpu_count", "capability", "driver", "torch", "torch_build", "triton", "cuda_runtime", "python", "os"):
            if k in environment:
                lines.append(f"- **{k}**: {environment[k]}")
        for name, info in (environment.get("packages") or {}).items():
            lines.append(f"- **package {name}**: {info}")
        lines.append("")
    lines += ["## Verdicts", "", "| probe | family | target | verdict | matched | expected | worst error vs expected | device |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        we = "" if r.worst_error is None else f"{r.worst_error:.3g}"
        lines.append(f"| {r.probe} | {r.family} | `{r.target}` | **{r.verdict}** | {r.matched or ''} | {r.expected or ''} | {we} | {r.device or ''} |")
    lines += ["", "## Per-hypothesis errors (worst abs / rel over cases)", ""]
    for r in results:
        opts = r.details.get("options")
        lines.append(f"### {r.probe} · {r.family} · `{r.target}`" + (f" · options {opts}" if opts else ""))
        lines.append("")
        if r.skipped_reason:
            lines.append(f"- {r.verdict}: {r.skipped_reason}")
        for h, v in (r.details.get("hypotheses") or {}).items():
            lines.append(f"- `{h}`: abs {v.get('abs')}, rel {v.get('rel')}" + (" ← matched" if h == r.matched else ""))
        for c in r.details.get("cases", ()):
            lines.append(f"- case *{c.get('name')}*: matched **{c.get('matched')}**; shapes {c.get('shapes')}; dtypes {c.get('dtypes')}"
                         + (f"; strides {c.get('strides')}" if c.get("strides") else "") + (f"; {c['note']}" if c.get("note") else ""))
        for k, v in (r.details.get("details") or {}).items():
            lines.append(f"- {k}: {v}")
        for e in r.details.get("evidence", ()):
            lines.append(f"- evidence: {e}")
        if r.details.get("stderr_tail"):
            lines.append(f"- stderr tail: `{r.details['stderr_tail'][-300:]!s}`")
        lines.append(f"- seconds: {r.details.get('seconds')}; rerun: `{r.details.get('rerun', '')}`")
        lines.append("")
    return "\n".join(lines)


def results_json(results: Sequence[ProbeResult], environment: Mapping[str, Any] | None = None) -> dict[str, Any]:
    from dataclasses import asdict

    return {"schema": "metax-audit/probe-run/v1", "environment": dict(environment or {}), "probes": [
        {**asdict(r), "hypotheses": {k: (v if v is None or (v == v and abs(v) != float("inf")) else repr(v)) for k, v in r.hypotheses.items()}}
        for r in results]}


def write_probe_reports(results: Sequence[ProbeResult], environment: Mapping[str, Any], output_dir: Path) -> list[Path]:
    """probes.json + probes.md + environment.json under output_dir (the `probe` command's outputs)."""
    from metax_audit.evidence import save_environment

    output_dir.mkdir(parents=True, exist_ok=True)
    env_path = save_environment(environment, output_dir / "environment.json")
    json_path = output_dir / "probes.json"
    json_path.write_text(json.dumps(results_json(results, environment), indent=2, default=str) + "\n")
    md_path = output_dir / "probes.md"
    md_path.write_text(render_markdown(results, environment, title="metax-audit probe report") + "\n")
    return [md_path, json_path, env_path]


def main(argv: Sequence[str] | None = None) -> int:
    """Device entry point without typer: `python -m metax_audit.probing --backend flashinfer --out DIR`."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m metax_audit.probing")
    p.add_argument("--backend", action="append", default=[])
    p.add_argument("--target", action="append", default=[], help="TARGET or TARGET@FAMILY; repeatable")
    p.add_argument("--probes", default="", help="comma-separated; default: all that apply")
    p.add_argument("--device", default="auto")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--extra", action="append", default=[], help="extra run TARGET|FAMILY|PROBE|k=v;k=v")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    from metax_audit.evidence import collect_environment, save_environment

    pairs = [pair for b in a.backend for pair in backend_targets(b)]
    for t in a.target:
        tgt, _, fam = t.partition("@")
        pairs.append((tgt, fam or _family_of(tgt)))
    wanted = [x for x in a.probes.split(",") if x]
    jobs: list[tuple[str, str, str, dict[str, str]]] = []
    for spec in a.extra:  # the explicit pairings first: they are the runs asked for by name
        tgt, fam, probe, *rest = spec.split("|")
        jobs.append((tgt, fam, probe, dict(kv.split("=", 1) for kv in (rest[0].split(";") if rest and rest[0] else []))))
    for tgt, fam in pairs:
        jobs += [(tgt, fam, p, {}) for p in (wanted or applicable(fam)) if p in applicable(fam)]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = collect_environment(packages=("torch", "triton", "flashinfer-python", "flashinfer", "vllm", "flash-attn"))
    save_environment(env, out / "environment.json")
    groups: dict[tuple[str, str], list[tuple[str, dict[str, str]]]] = {}
    for tgt, fam, probe, opts in jobs:
        groups.setdefault((tgt, fam), []).append((probe, opts))
    done: list[ProbeResult] = []

    def report(r: ProbeResult) -> None:
        done.append(r)
        print(probe_line(r), flush=True)
        # written after every probe: a command killed at its time limit still leaves a report
        (out / "probes.json").write_text(json.dumps(results_json(done, env), indent=2, default=str) + "\n")
        (out / "probes.md").write_text(render_markdown(done, env, title="metax-audit probe report") + "\n")

    results = run_many([(t, f, js) for (t, f), js in groups.items()], device=a.device, timeout=a.timeout, on_result=report)
    (out / "probes.json").write_text(json.dumps(results_json(results, env), indent=2, default=str) + "\n")
    (out / "probes.md").write_text(render_markdown(results, env, title="metax-audit probe report") + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
