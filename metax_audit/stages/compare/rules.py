# The comparison's rules (MXA201-MXA206), the NVIDIA capability vocabulary it looks for, and the
# action/validation each kind of difference asks for.
from __future__ import annotations

import re

from metax_audit.core.findings import rule
from metax_audit.core.models import Category, Severity

R_UNDECLARED = rule(
    "MXA201", Category.UNDECLARED_DIFFERENCE, Severity.WARNING,
    "port differs from its upstream counterpart without a declaration",
    "The port changes, adds or removes code relative to the upstream file it follows, and no vendor marker or "
    "comment in or directly above the changed statement says why. Declare the change with its reason (and the "
    "probe or test that proves it), or waive it. The hunks of one function are one finding, with one evidence "
    "line per hunk saying whether it may change a kernel or why it is info, and who changed it (port-only, or "
    "drift when upstream changed it after the base release: then it joins the drift finding).",
).id


R_ARCH = rule(
    "MXA202", Category.ARCH_CHECK, Severity.WARNING,
    "NVIDIA architecture/capability check kept, added or removed in the port",
    "An is_device_capability / has_device_capability / SM-number check answers a question about "
    "NVIDIA GPUs; on the vendor device it is either meaningless or decided by whatever capability "
    "the platform reports. Replace it with a vendor feature query, or declare why the number applies. "
    "The checks of one function are one finding listing each line; a predicate the vendor platform answers "
    "with a constant, an NVIDIA floor the port answers itself, or a check inherited unchanged is info.",
).id


R_DRIFT = rule(
    "MXA203", Category.UPSTREAM_DRIFT, Severity.WARNING,
    "upstream changed this between the base and target release and the port did not follow",
    "Between the base release the port was synced to and the target release, upstream added or "
    "changed a method, signature, default or kernel argument. The port still has the old form. "
    "Take the change, or declare why the vendor kernel cannot. Hunks of one function are one finding (with the "
    "function's port-only differences), and so is one upstream edit missed in several functions.",
).id


R_DRIFT_TAKEN = rule(
    "MXA204", Category.UPSTREAM_DRIFT, Severity.INFO,
    "upstream change between base and target release is followed by the port",
    "Recorded so the reviewer sees which upstream changes the sync took.",
).id


R_VENDOR_ONLY = rule(
    "MXA205", Category.COVERAGE, Severity.INFO,
    "port file has no upstream counterpart (vendor-only)",
    "No upstream file exists at the mapped path, in the config's path_map, or for the backend enum "
    "member the file registers. It is audited on its own; add a path_map entry if it was moved.",
).id


R_UNREADABLE = rule(
    "MXA206", Category.COVERAGE, Severity.WARNING,
    "port file or its upstream counterpart could not be compared",
    "One side could not be read or parsed, so no differences were computed for this file.",
).id


# Calls that ask about an NVIDIA architecture; names only, the receiver does not matter.
# `supports_compute_capability` is left out: calling it asks the backend's own hook (which the
# port overrides and which is compared as a class attribute), not an NVIDIA question.
ARCH_CALLS = frozenset({
    "is_device_capability", "has_device_capability", "get_device_capability",
    "is_device_capability_family", "DeviceCapability",
    "is_blackwell", "is_hopper", "is_sm90", "is_sm100", "is_sm100f_supported",
})


# Platform predicates that are false on an out-of-tree port: a branch under one of them never runs there.
FOREIGN_PLATFORM_CALLS = frozenset({"is_rocm", "is_xpu", "is_tpu", "is_cpu", "is_hpu", "is_neuron"})


# Superset of every ARCH_CALLS name and SM string, searched once over the whole file text.
_ARCH_TEXT = re.compile(r"capabilit|hopper|blackwell|sm_?\d", re.IGNORECASE)


_SM_TEXT = re.compile(r"\bsm_?(?:[6-9]\d|1[0-2]\d)[a-z]?\b", re.IGNORECASE)


_LOG_METHODS = frozenset({"debug", "info", "warning", "warning_once", "info_once", "debug_once", "error", "exception"})


_CAPABILITY_QUERY = re.compile(r"^(is_\w+|supports_\w+|has_\w+|\w+_supports_\w+|\w+_supported|\w+_available)$")


_CLASS_ATTR_METHODS = re.compile(r"^(get_supported_\w+|supports_\w+|get_supported_kernel_block_sizes|get_min_block_size)$")


ACTIONS: dict[str, tuple[str, str]] = {
    # kind -> (action, validation); the action follows from what the evidence shows.
    "vendor-kernel-import": (
        "keep if the vendor callable implements the same contract; confirm every argument the call sites pass is accepted",
        "signature check of the vendor callable; probe the kernel family it implements",
    ),
    "port-module-import": (
        "none if the port's module is in scope: it is compared with its own upstream counterpart",
        "the review of the imported port module",
    ),
    "foreign-platform-branch": (
        "none: the branch is guarded by another platform's predicate, which is false on the port's platform",
        "none",
    ),
    "arch-check": (
        "replace the NVIDIA capability test with a vendor feature query, or state which vendor capability value makes it correct",
        "record current_platform.get_device_capability() on the vendor device; port tests on both sides of the check",
    ),
    "feature-disabled": (
        "declare it and reject the configuration up front (platform check_and_update_config) instead of failing mid-forward",
        "port tests: the disabled path raises a clear error; the enabled paths still pass",
    ),
    "fallback-added": (
        "document the condition that selects the fallback and which kernel each branch calls",
        "probe both branches (same inputs, both paths) against the reference",
    ),
    "argument-commented-out": (
        "check the installed vendor kernel: restore the argument if it now exists, otherwise declare what the default implies",
        "signature check of the kernel; probe the semantics the argument controls",
    ),
    "upstream-not-followed": (
        "take the upstream change, or declare why the vendor kernel cannot support it",
        "port tests on the changed path; signature check where a kernel argument changed",
    ),
    "signature-changed": (
        "check every caller passes the port's parameters; declare the reason",
        "signature check; port tests",
    ),
    "class-attribute": (
        "confirm the vendor kernel supports exactly the listed values (dtypes, kv-cache dtypes, block/head sizes)",
        "probe with each listed value (layout, fp8-scale) on the vendor device",
    ),
    "call-changed": (
        "confirm the changed arguments match the vendor kernel's contract",
        "signature check; probe the kernel family",
    ),
    "added": ("declare why the port needs it", "port tests covering the added code"),
    "removed": ("declare why the port drops it (vendor kernel lacks the feature?)", "port tests; signature check"),
    "changed": ("declare the reason for the vendor change", "port tests on the changed path"),
    "cosmetic": ("none", "none"),
    "moved": ("confirm the new order computes the same values", "port tests on the function"),
}


_ABSENT = ("is absent from the port", "has no port counterpart")
