# The one subprocess wrapper: a timeout, captured output, and a typed error carrying stderr,
# so an audited kernel that crashes or hangs becomes a recorded fact instead of our crash.
from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from metax_audit.errors import SubprocessError


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
        proc = subprocess.run(
            list(args), cwd=cwd, env=full_env, input=input, capture_output=True, text=True,
            timeout=timeout, errors="replace",
        )
    except FileNotFoundError as exc:
        raise SubprocessError(f"cannot run {args[0]!r}: {exc.strerror}") from exc
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return Completed(tuple(args), -1, out, err, timed_out=True)
    done = Completed(tuple(args), proc.returncode, proc.stdout, proc.stderr)
    if check and proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or [""]
        raise SubprocessError(f"{' '.join(args[:3])} failed ({proc.returncode}): {tail[0]}", stderr=proc.stderr, returncode=proc.returncode)
    return done
