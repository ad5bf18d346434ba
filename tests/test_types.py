# Type checking is part of the test suite, so the one test command (README, .ci/run) runs it and
# every engineer who runs the suite before a push sees a type error, not only CI.
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_passes_on_the_configured_packages() -> None:
    # mypy is in the [test] extra: without it this fails (it does not skip), as CI must.
    # --cache-dir outside the checkout keeps the run from writing .mypy_cache into a clean clone.
    cache = Path(tempfile.gettempdir()) / "metax-audit-mypy-cache"
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(cache)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
