# When this process started, on the time.perf_counter() scale: the review's stated wall time runs
# from there (interpreter start-up and imports included) to the last report rendered.
from __future__ import annotations

import os
import time

_IMPORTED = time.perf_counter()  # the fallback: this module is imported before the CLI's commands


def process_age() -> float | None:
    """Seconds since this process started, from the kernel's record of its start (Linux /proc);
    None where that is not available or not believable."""
    try:
        with open(f"/proc/{os.getpid()}/stat", "rb") as fh:
            stat = fh.read().decode("ascii", "replace")
        # the command name (field 2) may hold spaces and parentheses: fields count from the last ')'
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    # a clock tick's rounding below zero is fine; a start over a minute before this module's import
    # (a time namespace, a kernel that counts otherwise) is not believed
    return max(age, 0.0) if -1.0 < age < time.perf_counter() - _IMPORTED + 60.0 else None


def process_started() -> float:
    """The time.perf_counter() value at this process's start (or, failing that, at this module's import)."""
    now = time.perf_counter()
    age = process_age()
    return now - age if age is not None else _IMPORTED
