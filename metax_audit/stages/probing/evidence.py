# The environment record: device, driver, torch/Triton builds, CUDA or MACA runtime, Python, OS
# and kernel package versions, collected in the target interpreter with every fact guarded.
from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from metax_audit.core import inputs
from metax_audit.core.config import AuditConfig
from metax_audit.core.errors import AuditError

SCHEMA = "metax-audit/environment/v1"
DEFAULT_PACKAGES = ("torch", "triton", "flashinfer-python", "flashinfer", "flash-attn", "flash_mla", "vllm", "vllm-metax")
# Facts that describe the stack; a change in any of them means results must not be mixed.
STACK_KEYS = ("gpu", "gpu_count", "capability", "driver", "torch", "torch_build", "torch_cuda", "torch_hip", "torch_maca",
              "triton", "triton_backend", "cuda_runtime", "maca_version", "python", "os")


def _worker(packages: Sequence[str]) -> dict[str, Any]:
    """Runs inside the target interpreter (stdlib at module level; torch/triton guarded)."""
    import os
    import platform

    facts: dict[str, Any] = {"schema": SCHEMA, "torch": None, "triton": None, "gpu": None, "gpu_count": None}

    def guard(key: str, fn: Any) -> None:
        try:
            facts[key] = fn()
        except Exception as exc:  # a failing fact is a value
            facts[key] = f"<error: {type(exc).__name__}: {str(exc)[:200]}>"

    guard("python", lambda: f"{platform.python_version()} ({sys.executable})")
    guard("os", lambda: f"{platform.system()} {platform.release()} {platform.machine()}")
    guard("host", platform.node)
    guard("torch_error", lambda: _torch_facts(facts))  # the *_error slot is None when all was read
    guard("triton_error", lambda: _triton_facts(facts))
    guard("driver", _driver)
    guard("nvcc", lambda: (_run(["nvcc", "--version"]) or "").splitlines()[-1:] or None)
    guard("cuda_runtime", lambda: facts.get("torch_cuda"))
    maca = os.environ.get("MACA_PATH")
    facts["maca_path"] = maca
    guard("maca_version", lambda: _maca_version(maca))
    guard("mx_smi", lambda: _run(["mx-smi"]))
    guard("packages", lambda: _package_facts(packages))
    return facts


def _torch_facts(facts: dict[str, Any]) -> str | None:
    """torch's version and build (CUDA, HIP, MACA or CPU) and the devices it sees, into `facts`;
    None for the torch_error slot (an exception fills it instead)."""
    import torch

    facts["torch"] = torch.__version__
    v = torch.version
    facts["torch_cuda"] = getattr(v, "cuda", None)
    facts["torch_hip"] = getattr(v, "hip", None)
    facts["torch_maca"] = getattr(v, "maca", None)  # MetaX builds expose their runtime here
    local = torch.__version__.split("+", 1)[1] if "+" in torch.__version__ else ""
    facts["torch_local_version"] = local
    facts["torch_build"] = ("maca" if facts["torch_maca"] or "metax" in local else "hip" if facts["torch_hip"]
                            else "cuda" if facts["torch_cuda"] else "cpu")
    facts["torch_version_attrs"] = {k: str(getattr(v, k)) for k in dir(v) if not k.startswith("_") and isinstance(getattr(v, k), str | type(None))}
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        facts["gpu_count"] = n
        facts["gpu"] = ", ".join(sorted({torch.cuda.get_device_name(i) for i in range(n)}))
        facts["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    else:
        facts["gpu_count"] = 0
        facts["gpu"] = None
    return None


def _triton_facts(facts: dict[str, Any]) -> str | None:
    import triton

    facts["triton"] = triton.__version__
    try:
        from triton.runtime import driver

        tgt = driver.active.get_current_target()
        facts["triton_backend"] = f"{tgt.backend}:{tgt.arch}"
    except Exception as exc:
        facts["triton_backend"] = f"<unavailable: {type(exc).__name__}: {str(exc)[:120]}>"
    return None


def _run(cmd: list[str]) -> str | None:
    import shutil
    import subprocess

    if not shutil.which(cmd[0]):
        return None
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    return (p.stdout or p.stderr).strip()[:2000]


def _driver() -> str | None:
    out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return out.splitlines()[0].strip() if out else None


def _maca_version(maca: str | None) -> str | None:
    if not maca:
        return None
    for name in ("version.txt", "version", "VERSION"):
        p = Path(maca) / name
        if p.is_file():
            return p.read_text(errors="replace").strip()[:200]
    return "<MACA_PATH set, no version file found>"


def _package_facts(packages: Sequence[str]) -> dict[str, Any]:
    """Version, wheel tags, local version and direct URL of each installed distribution named."""
    from importlib import metadata

    out: dict[str, Any] = {}
    for name in packages:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        info: dict[str, Any] = {"version": dist.version}
        wheel = dist.read_text("WHEEL") or ""
        tags = [ln.split(":", 1)[1].strip() for ln in wheel.splitlines() if ln.startswith("Tag:")]
        info["wheel_tags"] = tags
        if "+" in dist.version:
            info["local_version"] = dist.version.split("+", 1)[1]
        direct = dist.read_text("direct_url.json")
        if direct:
            info["direct_url"] = json.loads(direct).get("url")
        out[name] = info
    return out


def collect_environment(*, python: str | None = None, packages: Sequence[str] = DEFAULT_PACKAGES, timeout: float = 120,
                        never_import: Sequence[str] = (AuditConfig.port_package,)) -> dict[str, Any]:
    """The environment record of `python` (default: this interpreter), gathered in a subprocess
    so a broken torch install is a recorded fact, not our crash. The worker stands behind the port
    fence (`never_import`: the port's packages; subproc.fenced): it reads the port's version from
    its metadata and never imports it, nor a sitecustomize of its checkout."""
    from metax_audit.core.subproc import run_python

    root = Path(__file__).resolve().parents[3]
    import os

    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    done = run_python(python or sys.executable, ["-m", "metax_audit.stages.probing.evidence", "--worker", *packages], env=env, timeout=timeout,
                      never_import=never_import)
    if done.timed_out:
        return {"schema": SCHEMA, "error": f"environment worker timed out after {timeout:g}s", "stderr_tail": done.stderr[-1000:]}
    try:
        record: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return record
    except (IndexError, json.JSONDecodeError):
        return {"schema": SCHEMA, "error": f"environment worker exited {done.returncode} without a record", "stderr_tail": done.stderr[-1000:]}


def save_environment(env: Mapping[str, Any], path: Path | str) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(dict(env), indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    return p


def load_environment(path: Path | str) -> dict[str, Any]:
    try:
        data = json.loads(inputs.read_text(path))
    except (OSError, ValueError, RecursionError) as exc:
        raise AuditError(f"cannot read environment record {path}: {exc}; capture one with `metax-audit evidence`") from None
    if not isinstance(data, dict):
        raise AuditError(f"environment record {path} is not a JSON object")
    return data


def diff_environment(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """One line per stack fact or kernel package version that changed ("" when the same)."""
    lines = []
    for key in STACK_KEYS:
        a, b = old.get(key), new.get(key)
        if a != b:
            lines.append(f"{key}: {a!r} -> {b!r}")
    po, pn = old.get("packages") or {}, new.get("packages") or {}
    if isinstance(po, dict) and isinstance(pn, dict):
        for name in sorted(set(po) | set(pn)):
            a = (po.get(name) or {}).get("version") if isinstance(po.get(name), dict) else po.get(name)
            b = (pn.get(name) or {}).get("version") if isinstance(pn.get(name), dict) else pn.get(name)
            if a != b:
                lines.append(f"package {name}: {a or 'absent'} -> {b or 'absent'}")
    return lines


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        from metax_audit.stages.introspect_worker.fence import enter_site

        enter_site()  # the port fence first, then site (started with -S): see subproc.fenced
        print(json.dumps(_worker(sys.argv[2:] or DEFAULT_PACKAGES), default=str))
    else:
        print(json.dumps(collect_environment(), indent=2, default=str))
