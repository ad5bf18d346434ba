# The introspection worker as a subprocess of the target interpreter: its command line, sandbox
# (an empty cwd, caches in a temp dir, the fence against the port), one run over a list of
# targets that survives a hang or crash, and a worker prestarted while the static stages run.
from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from metax_audit.core import subproc, tempdirs
from metax_audit.core.errors import IntrospectError, SubprocessError
from metax_audit.core.models import CallableFact
from metax_audit.stages.introspect.manifest import fact_from_json

WORKER = Path(__file__).parents[1] / "introspect_worker" / "__main__.py"
# The port packages the worker must refuse (JSON list); read by introspect_worker.fence.enter_site, a
# standalone script this module never imports.
FENCE_ENV = "METAX_AUDIT_NEVER_IMPORT"


# Cache/JIT directories of the usual kernel stack (XDG, torch extensions, Triton, FlashInfer).
_CACHE_VARS = ("XDG_CACHE_HOME", "TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE")


def _run_worker(
    interpreter: str,
    targets: list[str],
    extra_path: Sequence[Path],
    static_roots: Sequence[Path],
    timeout: float,
    static_only: bool,
    facts: dict[str, CallableFact],
    meta: dict[str, Any],
    distributions: dict[str, dict[str, str]],
    never_import: Sequence[str] = (),
    prestarted: Prestarted | None = None,
    op_namespaces: Mapping[str, str] = {},  # read only
) -> tuple[str, str, str] | None:
    """Run one worker (or finish `prestarted`); fill `facts`. Returns (target, status, error) when
    it hung or died on one."""
    request = {
        "targets": targets,
        "extra_path": [str(p) for p in extra_path],
        "static_roots": [str(p) for p in static_roots],
        "static_only": static_only,
        "never_import": list(never_import),
        "op_namespaces": dict(op_namespaces),
    }
    if prestarted is not None:
        done = prestarted.finish(json.dumps(request), timeout)
    else:
        with _sandbox(never_import) as (cwd, env):
            done = subproc.run(worker_command(interpreter), cwd=cwd, env=env, timeout=timeout,
                               input=json.dumps(request))
    current, finished, preloading = _read_events(done.stdout, facts, meta, distributions)
    if finished:
        return None
    if prestarted is not None and current is None and not any(t in facts for t in targets):
        # It failed before reaching a target, importing a kernel package ahead of time. A hang is
        # the first target of that package's hang (waiting it out again would double the wait);
        # anything else is run again the ordinary way, which attributes it to its target.
        top = (preloading or "").split(".")[0]
        culprit = next((t for t in targets if done.timed_out and top and t.split(".")[0] == top), None)
        if culprit is not None:
            return culprit, "timeout", f"importing or inspecting it did not finish within {timeout:g} s"
        return _run_worker(interpreter, targets, extra_path, static_roots, timeout, static_only, facts, meta,
                           distributions, never_import, op_namespaces=op_namespaces)
    tail = " | ".join(done.stderr.strip().splitlines()[-3:])[:500]
    if current is None:
        if not any(t in facts for t in targets):
            raise IntrospectError(
                f"the introspection worker did not start under {interpreter} (exit {done.returncode}): {tail or 'no output'}; "
                "check --python points at a working interpreter"
            )
        current = next((t for t in targets if t not in facts), None)
        if current is None:
            return None
    if done.timed_out:
        return current, "timeout", f"importing or inspecting it did not finish within {timeout:g} s"
    return current, "crash", f"the worker died (exit {done.returncode}) on it: {tail or 'no stderr'}"


def _read_events(stdout: str, facts: dict[str, CallableFact], meta: dict[str, Any],
                 distributions: dict[str, dict[str, str]]) -> tuple[str | None, bool, str | None]:
    """Fill `facts`, `meta` and `distributions` from the worker's JSON lines; returns the target it
    started last without a fact, whether it finished, and the package it was preloading."""
    current: str | None = None
    finished = False
    preloading: str | None = None  # the package a prestarted worker was importing ahead of the targets
    for line in stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        kind = event.pop("event", None)
        if kind == "start":
            current = event.get("target")
        elif kind == "fact":
            facts[event["target"]] = fact_from_json(event)
            current = None
        elif kind == "done":
            finished = True
            distributions.update(event.get("distributions") or {})
            meta.update(event)
        elif kind == "preload":
            preloading = str(event.get("module"))
        elif kind == "preloaded":
            preloading = None
    return current, finished, preloading


def worker_command(interpreter: str) -> list[str]:
    """The worker's command line: -S so that site (its .pth files and any sitecustomize) only runs
    inside the worker once the fence against the port stands (introspect_worker.fence.enter_site)."""
    return [interpreter, "-B", "-S", str(WORKER)]


@contextmanager
def _sandbox(never_import: Sequence[str] = ()) -> Iterator[tuple[Path, dict[str, str]]]:
    """An empty temp dir as the worker's cwd, so nothing is imported from, or written into, the
    user's tree; caches that kernel packages create at import time (JIT logs, build dirs) go there
    too, so capturing facts leaves the user's home and site-packages as they were."""
    with tempdirs.scratch("introspect") as cwd:
        sandbox = {name: str(Path(cwd) / "cache") for name in _CACHE_VARS}
        yield Path(cwd), {**subproc.PYTHON_ENV, FENCE_ENV: json.dumps(sorted(set(never_import))), **sandbox}


class Prestarted:
    """A worker started before its targets are known, importing the kernel packages meanwhile.
    introspect(prestarted=...) finishes it; discard() stops it when it is not needed."""

    def __init__(self, started: subproc.Started, sandbox: ExitStack, interpreter: str,
                 extra_path: Sequence[Path]) -> None:
        self._started: subproc.Started | None = started
        self._sandbox = sandbox
        self._interpreter = interpreter
        self._extra_path = [str(p) for p in extra_path]

    def fits(self, interpreter: str, extra_path: Sequence[Path]) -> bool:
        return interpreter == self._interpreter and [str(p) for p in extra_path] == self._extra_path

    def finish(self, request: str, timeout: float) -> subproc.Completed:
        """The worker's output once it answered `request`; the timeout counts from now."""
        assert self._started is not None, "a prestarted worker serves one request"
        started, self._started = self._started, None
        try:
            return started.finish(request, timeout)
        finally:
            self._sandbox.close()

    def discard(self) -> None:
        if self._started is not None:
            started, self._started = self._started, None
            started.kill()
            self._sandbox.close()


def prestart(preload: Sequence[str], *, python: str | None = None, extra_path: Sequence[Path] = (),
             never_import: Sequence[str] = ()) -> Prestarted | None:
    """Start a worker that imports `preload` (the kernel packages) while the caller finds the
    targets; None when it cannot be started (the ordinary run then reports why)."""
    interpreter = python or sys.executable
    stack = ExitStack()
    cwd, env = stack.enter_context(_sandbox(never_import))
    head = json.dumps({"preload": list(preload), "extra_path": [str(p) for p in extra_path]}) + "\n"
    try:
        started = subproc.start(worker_command(interpreter), cwd=cwd, env=env, first_input=head)
    except SubprocessError:
        stack.close()
        return None
    return Prestarted(started, stack, interpreter, extra_path)
