# The bundled demo: a synthetic vLLM-shaped upstream, a FlashInfer 0.2.x-shaped kernel stub and a
# vendor port of them, plus the builder that turns the port into a git repo with staged changes.
from __future__ import annotations

import os
import shutil
from pathlib import Path

from metax_audit.core import gitcmd
from metax_audit.core.errors import AuditError
from metax_audit.core.subproc import run

PORT_PACKAGE = "vllm_metax"

# The committed (older) flashinfer.py differs from the bundled one by these edits, so the staged
# change is a realistic regression: the base-2 -> base-e LSE conversion is dropped and `.item()`
# lands in the graph-captured decode path.
_STAGED_FILE = "vllm_metax/v1/attention/backends/flashinfer.py"
_OLDER_EDITS: tuple[tuple[str, str], ...] = (
    (
        "                merge_attn_states(output[num_decode_tokens:], ctx_out, ctx_lse, new_out, new_lse)\n",
        "                # FlashInfer's LSE is base 2; merge_attn_states works in base e.\n"
        "                merge_attn_states(\n"
        "                    output[num_decode_tokens:], ctx_out, [x * _LN2 for x in ctx_lse], new_out,\n"
        "                    [x * _LN2 for x in new_lse],\n"
        "                )\n",
    ),
    (
        "            # ----- Metax Modification -----\n"
        "            # MACA keeps the KV scales as device tensors only.\n"
        "            k_scale = layer._k_scale.item()\n"
        "            v_scale = layer._v_scale.item()\n"
        "            # ----- Metax Modification -----\n",
        "",
    ),
    ("                k_scale=k_scale,\n                v_scale=v_scale,\n                out=output[:num_decode_tokens],\n",
     "                k_scale=layer._k_scale_float,\n                v_scale=layer._v_scale_float,\n"
     "                out=output[:num_decode_tokens],\n"),
)
# Left unstaged in the worktree: the fix for the keyword FlashInfer 0.2.x's decode plan rejects,
# so a staged review must still report it while a worktree review must not.
_UNSTAGED_EDIT = ("                fixed_split_size=None,\n", "                # fixed_split_size=None,\n")
# Left untracked: a helper the maintainer has not added yet.
_UNTRACKED_FILE = "vllm_metax/v1/attention/ops/lse_utils.py"
_UNTRACKED_TEXT = (
    "# LSE base conversion for merging FlashInfer (base 2) results with base-e kernels.\n"
    "import math\n\n"
    "LN2 = math.log(2.0)\n\n\n"
    "def log2_to_ln(lse):\n"
    "    return [x * LN2 for x in lse]\n"
)
_PYPROJECT = (
    '[project]\nname = "vllm-metax-demo"\nversion = "0.26.0"\n\n'
    '[tool.metax-audit]\nport-package = "vllm_metax"\nupstream-package = "vllm"\n'
)
# A fixed identity and clock make the demo commit reproducible and independent of the user's git setup.
_GIT_ENV = {
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+00:00",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+00:00",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}
_GIT_FLAGS = ("-c", "user.name=metax-audit demo", "-c", "user.email=demo@metax-audit.invalid",
              "-c", "commit.gpgsign=false", "-c", "core.hooksPath=" + os.devnull, "-c", "init.defaultBranch=main")


def data_root() -> Path:
    # A plain path (not importlib.resources) because git and the tracer need real files; the
    # package is installed unzipped (setuptools package-data).
    return Path(__file__).resolve().parent / "data"


def upstream_root() -> Path:
    """Directory holding the demo upstream package `vllm/`."""
    return data_root() / "upstream"


def stack_root() -> Path:
    """Directory holding the demo kernel stub package `flashinfer/`."""
    return data_root() / "stack"


def port_root() -> Path:
    """Directory holding the demo port package `vllm_metax/`."""
    return data_root() / "port"


def _git(dest: Path, *args: str) -> str:
    done = run(gitcmd.command(dest, *_GIT_FLAGS, *args), env={**gitcmd.GIT_ENV, **_GIT_ENV}, timeout=60, check=True)
    return done.stdout


def _older(text: str) -> str:
    for new, old in _OLDER_EDITS:
        if text.count(new) != 1:
            raise AuditError(f"demo data changed: cannot derive the older {_STAGED_FILE} (edit not found once)")
        text = text.replace(new, old)
    return text


def build_demo_repo(dest: Path) -> Path:
    """Create a git repo of the demo port at `dest` (absent or empty) and return it.

    HEAD holds an older port; the index holds the bundled port (a staged regression in
    flashinfer.py); the worktree has one more unstaged edit and one untracked file.
    """
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise AuditError(f"demo destination {dest} is not empty; pass a new or empty directory")
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(port_root() / PORT_PACKAGE, dest / PORT_PACKAGE,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (dest / "pyproject.toml").write_text(_PYPROJECT, encoding="utf-8")
    (dest / ".gitignore").write_text("__pycache__/\n*.pyc\n", encoding="utf-8")
    staged = dest / _STAGED_FILE
    current = staged.read_text(encoding="utf-8")
    staged.write_text(_older(current), encoding="utf-8")

    _git(dest, "init", "-q")
    _git(dest, "add", "-A")
    _git(dest, "commit", "-q", "-m", "Port attention backends to the demo upstream")

    staged.write_text(current, encoding="utf-8")
    _git(dest, "add", "--", _STAGED_FILE)

    old, new = _UNSTAGED_EDIT
    if current.count(old) != 1:
        raise AuditError(f"demo data changed: the unstaged edit of {_STAGED_FILE} no longer applies")
    staged.write_text(current.replace(old, new), encoding="utf-8")
    (dest / _UNTRACKED_FILE).write_text(_UNTRACKED_TEXT, encoding="utf-8")
    return dest


__all__ = ["PORT_PACKAGE", "build_demo_repo", "data_root", "port_root", "stack_root", "upstream_root"]
