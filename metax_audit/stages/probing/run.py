# Running probes: one `probes` worker subprocess per target (so a crashing or hanging kernel is a
# recorded result), one JSON job per probe, the device check, and the outcome as a ProbeResult.
from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from metax_audit.core.config import AuditConfig
from metax_audit.core.errors import ProbeError
from metax_audit.core.models import Category, ProbeResult
from metax_audit.stages.probing.findings import _CATEGORY
from metax_audit.stages.probing.targets import FAMILIES, PROBES, _family_of, _rerun, applicable

MARKER = "PROBE-OUTCOME "
READY = "PROBE-READY "
_PROBES_ROOT = Path(__file__).resolve().parents[3]  # the directory holding the `probes` package
DEFAULT_PORT = (AuditConfig.port_package,)  # what a probe worker never imports unless told otherwise


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
    """Run probes on `target`, all in one worker subprocess (`python -m metax_audit.probes worker`).

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
    """One `python -m metax_audit.probes worker` process for one target; restarted after a crash or hang."""

    def __init__(self, python: str, target: str, family: str, device: str, env: Mapping[str, str], timeout: float,
                 strict: bool, never_import: tuple[str, ...] | None = None) -> None:
        self._strict = strict
        self._never_import = never_import
        self._unloadable: str | None = None
        self._args = ["-m", "metax_audit.probes", "worker", "--family", family, "--target", target, "--device", device]
        self._python, self._env, self._timeout = python, dict(env), timeout
        self._target, self._family = target, family
        self._proc: Any = None
        self._cwd: Path | None = None

    def __enter__(self) -> _Worker:
        from metax_audit.core import tempdirs

        self._cwd = tempdirs.make("cwd")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()
        if self._cwd is not None:
            from metax_audit.core import fstree

            fstree.rmtree(self._cwd, ignore_errors=True)

    def _start(self) -> str | None:
        """Start the process and wait for its ready line; None when ready, else why not."""
        import contextlib
        import queue
        import tempfile
        import threading

        from metax_audit.core.subproc import spawn_python

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
