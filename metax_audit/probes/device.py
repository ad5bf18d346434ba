# Device evidence attached to every probe outcome: which GPU, driver-facing runtime, torch and
# Triton builds and kernel package versions produced the numbers. Every fact is guarded.
from __future__ import annotations

import platform
from typing import Any


def _guard(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:  # a failing fact is a value, never a crash
        return f"<error: {type(exc).__name__}: {exc}>"


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def describe(device: str) -> dict[str, Any]:
    """Facts about the device a probe ran on (cheap: no subprocess, no JIT)."""
    import torch

    facts: dict[str, Any] = {
        "device": device,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": _guard(lambda: torch.version.cuda),
        "torch_hip": _guard(lambda: getattr(torch.version, "hip", None)),
        "triton": _guard(lambda: _dist_version("triton")),
        "flashinfer": _guard(lambda: _dist_version("flashinfer-python") or _dist_version("flashinfer")),
    }
    if device.startswith("cuda"):
        idx = torch.device(device).index or 0
        facts["gpu"] = _guard(lambda: torch.cuda.get_device_name(idx))
        facts["capability"] = _guard(lambda: ".".join(map(str, torch.cuda.get_device_capability(idx))))
        facts["gpu_count"] = _guard(torch.cuda.device_count)
    return facts


def resolve(device: str) -> str:
    """`auto` -> cuda when torch sees one, else cpu."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
