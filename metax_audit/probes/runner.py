# Runs one probe on one target in-process and turns every way it can end (skip, absent control,
# crash inside the kernel, broken probe inputs) into a ProbeOutcome; `python -m metax_audit.probes` calls it.
from __future__ import annotations

import sys
import time
import traceback
from typing import Any

from metax_audit.probes.base import ControlAbsent, NotCheckable, ProbeContext, ProbeInputError, ProbeOutcome, ProbeSkip
from metax_audit.probes.device import describe, resolve
from metax_audit.probes.registry import load_target, registry


def run_one(probe: str, family: str, target: str, ctx: ProbeContext) -> ProbeOutcome:
    t0 = time.perf_counter()
    ctx = ProbeContext(device=resolve(ctx.device), seed=ctx.seed, options=dict(ctx.options))
    base: dict[str, Any] = {"probe": probe, "family": family, "target": target}
    try:
        device = describe(ctx.device)
    except Exception as exc:
        device = {"device": ctx.device, "error": f"{type(exc).__name__}: {exc}"}
    reg = registry()
    spec = reg.probes.get(probe)
    if spec is None:
        return ProbeOutcome(**base, verdict="error", device=device, evidence=(f"unknown probe {probe!r}; known: {sorted(reg.probes)}", *_broken(reg.broken)))
    if family not in spec.families:
        return ProbeOutcome(**base, verdict="skipped", device=device, skipped_reason=f"probe {probe} does not apply to family {family} (applies to {', '.join(spec.families)})")
    if spec.needs_cuda and not ctx.device.startswith("cuda") and ctx.options.get("simulate") != "1":
        return ProbeOutcome(**base, verdict="skipped", device=device, skipped_reason=f"probe {probe} needs a CUDA device (ran on {ctx.device})")
    try:
        tgt = load_target(target, family, ctx)
    except ProbeSkip as exc:
        return ProbeOutcome(**base, verdict="skipped", device=device, skipped_reason=str(exc))
    except Exception as exc:
        return ProbeOutcome(**base, verdict="error", device=device, skipped_reason=f"target could not be loaded: {type(exc).__name__}: {exc}", evidence=(_tail(),))
    shim = sys.modules.get("metax_audit.probes.families._maca_shim")  # present once a port op was loaded
    if shim is not None:
        shim.reset()
    try:
        out = spec.run(tgt, ctx)
    except ProbeSkip as exc:
        out = ProbeOutcome(**base, verdict="skipped", skipped_reason=str(exc), evidence=(f"target signature: {target}{tgt.signature}",))
    except ControlAbsent as exc:
        out = ProbeOutcome(**base, verdict="not-checkable", skipped_reason=f"control absent: {exc.control}", evidence=(f"inspected signature: {exc.signature}", *tgt.notes))
    except NotCheckable as exc:
        out = ProbeOutcome(**base, verdict="not-checkable", skipped_reason=str(exc), evidence=(f"target signature: {target}{tgt.signature}", *tgt.notes))
    except ProbeInputError as exc:
        out = ProbeOutcome(**base, verdict="error", skipped_reason=f"probe inputs do not discriminate: {exc}")
    except Exception as exc:  # the kernel raised: a recorded result blaming the target
        out = ProbeOutcome(**base, verdict="error", skipped_reason=f"target raised {type(exc).__name__}: {str(exc)[:500]}", evidence=(f"target signature: {target}{tgt.signature}", _tail()))
    from dataclasses import replace

    shim = sys.modules.get("metax_audit.probes.families._maca_shim")
    extra = shim.evidence() if shim is not None else ()
    return replace(out, device={**device, **out.device}, seconds=round(time.perf_counter() - t0, 3), evidence=(*out.evidence, *extra))


def _tail() -> str:
    return "traceback: " + "".join(traceback.format_exc().splitlines(keepends=True)[-6:]).strip()


def _broken(broken: dict[str, str]) -> tuple[str, ...]:
    return tuple(f"module {m} failed to import: {e}" for m, e in broken.items())
