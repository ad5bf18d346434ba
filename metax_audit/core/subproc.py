# The one subprocess wrapper: a timeout, captured output, and a typed error carrying stderr,
# so an audited kernel that crashes or hangs becomes a recorded fact instead of our crash.
from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from metax_audit.core.errors import SubprocessError


@dataclass(frozen=True)
class Completed:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False


def run(
    args: Sequence[str],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = 120,
    input: str | None = None,
    check: bool = False,
) -> Completed:
    """Run a command; a timeout is a result (timed_out=True), a missing program an error."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    try:
        # bytes, decoded here: text=True would turn every "\r" into "\n" (universal newlines), so a
        # file named "a\rb.py" in `git ls-files -z` came back as "a\nb.py" and fell out of the snapshot
        raw = subprocess.run(
            list(args), cwd=cwd, env=full_env, input=None if input is None else input.encode(),
            capture_output=True, timeout=timeout,
        )
    except OSError as exc:  # missing, not executable (`--python /tmp`), a bad interpreter line
        raise SubprocessError(f"cannot run {args[0]!r}: {exc.strerror}") from exc
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return Completed(tuple(args), -1, out, err, timed_out=True)
    stdout, stderr = raw.stdout.decode(errors="replace"), raw.stderr.decode(errors="replace")
    done = Completed(tuple(args), raw.returncode, stdout, stderr)
    if check and raw.returncode != 0:
        tail = stderr.strip().splitlines()[-1:] or [""]
        raise SubprocessError(f"{' '.join(args[:3])} failed ({raw.returncode}): {tail[0]}", stderr=stderr, returncode=raw.returncode)
    return done


class Started:
    """A process started ahead of its input (see start); finish() gives the same Completed as run."""

    def __init__(self, proc: subprocess.Popen[str], args: Sequence[str], stderr_file: IO[str]) -> None:
        self._proc, self._args, self._stderr = proc, tuple(args), stderr_file

    def finish(self, input: str, timeout: float | None) -> Completed:
        """Send the rest of stdin, wait up to `timeout` (counted from now), collect the output."""
        timed_out = False
        try:
            out, _ = self._proc.communicate(input=input, timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            self._proc.kill()
            out, _ = self._proc.communicate()
        except OSError:  # it died before reading stdin (a broken pipe): its output says why
            out = self._proc.stdout.read() if self._proc.stdout else ""
            self._proc.wait()
        return Completed(self._args, -1 if timed_out else self._proc.returncode, out or "", self._read_stderr(),
                         timed_out=timed_out)

    def kill(self) -> None:
        """Stop it (a no-op once finished); its output is dropped."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.communicate()
        self._read_stderr()

    def _read_stderr(self) -> str:
        f = self._stderr
        if f.closed:
            return ""
        f.seek(0)
        text = f.read()
        f.close()
        return text


def start(args: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None,
          first_input: str = "") -> Started:
    """Start a command now and give it `first_input` on stdin; the rest comes with finish().

    stderr goes to an unnamed temporary file, not a pipe, so a process that writes a lot of it
    while nobody reads cannot block. Raises SubprocessError when the program cannot be run."""
    import tempfile

    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    err = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")  # noqa: SIM115 (closed by Started)
    try:
        proc = subprocess.Popen(list(args), cwd=cwd, env=full_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, text=True, errors="replace")
    except OSError as exc:
        err.close()
        raise SubprocessError(f"cannot run {args[0]!r}: {exc.strerror}") from exc
    try:
        if first_input:
            assert proc.stdin is not None
            proc.stdin.write(first_input)
            proc.stdin.flush()
    except OSError:
        pass  # it died at once; finish() reports what it printed
    return Started(proc, args, err)


# Every Python interpreter the tool starts gets these: no bytecode written anywhere, and no unsafe
# first sys.path entry (the cwd for -c/-m, a script's directory) where the interpreter knows
# PYTHONSAFEPATH (3.11+). run_python's cwd is an empty private directory, so the entry that an older
# interpreter still adds names nothing the user wrote. PYTHONPYCACHEPREFIX is emptied (Python reads an
# empty PYTHON* variable as unset): with -B such an interpreter writes no bytecode anyway, so a prefix the
# caller set could only send its reads away from the stack's own __pycache__, and then the introspection
# worker compiled torch and flashinfer from source on every run (`import flashinfer`: 1.8 s -> 4.1 s CPU).
PYTHON_ENV = {"PYTHONSAFEPATH": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": ""}
# The variable naming the packages a fenced worker refuses (a JSON list); the same name as
# introspect_worker.fence.FENCE_ENV, which is standalone (run by path in the target interpreter) and so
# cannot import it from here (tests/test_introspect_worker.py holds the two equal).
FENCE_ENV = "METAX_AUDIT_NEVER_IMPORT"


def fenced(never_import: Sequence[str] | None) -> tuple[list[str], dict[str, str]]:
    """The extra flags and environment of a worker that must never import the port (`never_import`:
    its top-level packages; None: no fence). It starts with -S and learns the names from FENCE_ENV;
    its first act is introspect_worker.fence.enter_site(), which stands the fence and only then runs site,
    so .pth files of an editable install and a sitecustomize in the port's checkout meet the fence."""
    if never_import is None:
        return [], {}
    import json

    return ["-S"], {FENCE_ENV: json.dumps(sorted(set(never_import)))}


def fenced_code(code: str, *, no_customize: bool = True) -> str:
    """`code` for `python -S -c` behind the fence (run_python(..., never_import=...)): it first stands
    the fence from this package (imported by path, then taken off sys.path again) and runs site;
    with `no_customize`, a sitecustomize or usercustomize anywhere is refused too (a query that
    imports nothing has no reason to run anyone's code)."""
    root = str(Path(__file__).resolve().parents[2])
    extra = ("sitecustomize", "usercustomize") if no_customize else ()
    return (f"import sys\nsys.path.insert(0, {root!r})\nfrom metax_audit.stages.introspect_worker.fence import enter_site\n"
            f"sys.path.remove({root!r})\nenter_site({extra!r})\ndel sys, enter_site\n{code}")


def run_python(
    interpreter: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float | None = 120,
    input: str | None = None,
    isolated: bool = False,
    never_import: Sequence[str] | None = None,
) -> Completed:
    """Run `interpreter -B [-I] ARGS` with PYTHON_ENV from a neutral, empty cwd, never the caller's or
    the audited repo's (a json.py or torch.py there must not be imported). `isolated` adds -I (no
    PYTHON* variables, no user site) for helpers that need nothing from the environment;
    `never_import` starts it behind the port fence (see fenced())."""
    from metax_audit.core import tempdirs

    flags, fence = fenced(never_import)
    flags = ["-B", "-I", *flags] if isolated else ["-B", *flags]
    with tempdirs.scratch("cwd") as cwd:
        return run([interpreter, *flags, *args], cwd=cwd, env={**PYTHON_ENV, **(env or {}), **fence}, timeout=timeout,
                   input=input)


def spawn_python(interpreter: str, args: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None,
                 stderr: IO[str], never_import: Sequence[str] | None = None) -> subprocess.Popen[str]:
    """Start `interpreter -B ARGS` with PYTHON_ENV as a long-lived worker that talks in lines over
    stdin/stdout (the probe worker: one per target), from `cwd` (the caller's private empty
    directory, tempdirs.make("cwd")), in a new process group so that it and anything it started
    (JIT compilers) can be killed together; behind the port fence with `never_import` (see
    fenced()). Raises SubprocessError when it cannot start."""
    flags, fence = fenced(never_import)
    try:
        return subprocess.Popen([interpreter, "-B", *flags, *args], cwd=cwd,
                                env={**os.environ, **PYTHON_ENV, **(env or {}), **fence},
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True, errors="replace",
                                bufsize=1, start_new_session=True)
    except OSError as exc:
        raise SubprocessError(f"cannot run {interpreter!r}: {exc.strerror}") from exc


def run_binary(args: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 600,
               input: bytes | None = None) -> tuple[int, bytes, str]:
    """Like run() for a command whose stdout is binary (a tar stream): (returncode, stdout, stderr).
    A timeout is an error here: a truncated binary stream is not a usable result."""
    try:
        proc = subprocess.run(list(args), env={**os.environ, **(env or {})}, capture_output=True, timeout=timeout,
                              input=input)
    except OSError as exc:
        raise SubprocessError(f"cannot run {args[0]!r}: {exc.strerror}") from exc
    except subprocess.TimeoutExpired as exc:
        raise SubprocessError(f"{' '.join(args[:3])} timed out after {timeout:.0f} s") from exc
    return proc.returncode, proc.stdout, proc.stderr.decode(errors="replace")
