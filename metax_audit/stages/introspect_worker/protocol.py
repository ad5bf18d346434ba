# The worker's request/answer loop (protocol in __init__.py): preload, one fact per target by
# import, schema or source, and the closing record of the interpreter and its torch ops.
from __future__ import annotations

import contextlib
import json
import os
import platform
import socket
import sys
import time
from typing import Any

from .fence import enter_site
from .imported import _dist_kw, introspect_target
from .schemas import schema_fact
from .signatures import _fact, _short_error
from .static import port_target, static_target


def _preload(head: dict[str, Any], emit: Any) -> list[str]:
    """Import the kernel packages before the targets are known (the parent starts us early, so
    the seconds this takes overlap its static stages). A failure here is no fact: the target
    import that follows meets it again and reports it. {"event": "preload"} before each import
    tells the parent which package a hang or a crash happened in."""
    import importlib

    extra = [str(p) for p in head.get("extra_path") or []]
    for p in reversed(extra):
        sys.path.insert(0, p)
    for name in head.get("preload") or []:
        emit({"event": "preload", "module": name})
        with contextlib.suppress(BaseException):  # anything, even SystemExit: see above
            importlib.import_module(name)
    emit({"event": "preloaded"})
    return extra



def _op_provider(target: str, op_namespaces: dict[str, str]) -> tuple[str, str] | None:
    """(package, op name) for `torch.ops.<ns>.<op>` of a configured namespace, or `<package>.<op>`
    where the package provides one (torch_npu.npu_x aliases torch.ops.npu.npu_x)."""
    parts = target.split(".")
    if len(parts) == 4 and parts[:2] == ["torch", "ops"] and parts[2] in op_namespaces:
        return op_namespaces[parts[2]], parts[3]
    if len(parts) == 2 and parts[0] in set(op_namespaces.values()):
        return parts[0], parts[1]
    return None


def main() -> int:
    if sys.argv[1:] == ["--sys-path"]:  # what the stack cache keys on: the path as the worker sees it
        enter_site(("sitecustomize", "usercustomize"))  # nothing to import here: run no one's code
        print(json.dumps(sys.path))
        return 0
    enter_site()
    # Keep our JSON on the real stdout; anything the imported packages print goes to stderr.
    out_fd = os.dup(1)
    os.dup2(2, 1)
    out = os.fdopen(out_fd, "w", buffering=1)

    def emit(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj, default=str) + "\n")
        out.flush()

    request = _read_request(emit)
    if request is None:
        return 2
    static_roots = [str(p) for p in request.get("static_roots") or []]
    op_namespaces = {str(k): str(v) for k, v in (request.get("op_namespaces") or {}).items()}
    never_import = set(request.get("never_import") or [])
    dist_cache: dict[str, dict[str, str]] = {}
    for target in request.get("targets") or []:
        emit({"event": "start", "target": target})
        try:
            if target.split(".")[0] in never_import:
                # the port under review: read from the snapshot, never from an (editable) install
                fact = port_target(target, static_roots)
            elif request.get("static_only"):
                fact = static_target(target, static_roots)
                fact.update({k: v for k, v in _dist_kw(target.split(".")[0], dist_cache).items() if k not in fact})
            else:
                fact = _imported_fact(target, static_roots, op_namespaces, dist_cache)
        except BaseException as exc:  # keep going: one broken target is one fact
            fact = _fact(target, "crash", error=_short_error(exc))
        if fact.get("target") != target:  # a static read followed a re-export
            fact["defined_as"], fact["target"] = fact.get("target"), target
        emit({"event": "fact", **fact})
    emit({
        "event": "done",
        "python": sys.executable,
        "python_version": platform.python_version(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "captured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "distributions": dist_cache,
        "torch_ops": _torch_ops(),
    })
    return 0


def _read_request(emit: Any) -> dict[str, Any] | None:
    """The request from stdin, after the preload line when one comes first (its packages are
    imported meanwhile); None, with the closing record saying why, when it is not JSON."""
    first = sys.stdin.readline()
    head: Any = None
    with contextlib.suppress(ValueError):
        head = json.loads(first)
    preloaded_path = None
    if isinstance(head, dict) and "preload" in head:
        preloaded_path = _preload(head, emit)
        first = ""
    try:
        request: dict[str, Any] = json.loads(first + sys.stdin.read() or "{}")
    except ValueError as exc:
        emit({"event": "done", "error": f"bad request: {exc}"})
        return None
    if request.get("extra_path") != preloaded_path:
        for p in reversed(request.get("extra_path") or []):
            sys.path.insert(0, p)
    return request


def _imported_fact(target: str, static_roots: list[str], op_namespaces: dict[str, str],
                   dist_cache: dict[str, dict[str, str]]) -> dict[str, Any]:
    """The target as importing it shows it; when the import fails, a C++-registered op's documented
    schema or else the source read statically, with the import error in front."""
    fact = introspect_target(target, dist_cache)
    provider = _op_provider(target, op_namespaces)
    if provider is not None and fact["status"] in {"import-error", "not-found"}:
        # a C++-registered op whose library is not loaded here: its documented schema
        schema = schema_fact(target, provider[0], provider[1], static_roots)
        if schema is not None:
            why = f"{fact.get('error')}; read statically" if fact.get("error") else "read statically"
            schema["error"] = f"{why}: {schema['error']}" if schema.get("error") else why
            schema.update({k: v for k, v in _dist_kw(provider[0], dist_cache).items() if k not in schema})
            fact = schema
    if fact["status"] == "import-error":
        static = static_target(target, static_roots)
        static["error"] = f"import failed, read statically: {fact.get('error')}" + (
            f"; {static['error']}" if static.get("error") else "")
        if static["status"] != "import-error":
            static.update({k: v for k, v in _dist_kw(target.split(".")[0], dist_cache).items() if k not in static})
            fact = static
    return fact


def _torch_ops() -> dict[str, list[str]] | None:
    """Every op the dispatcher knows once the targets are imported, by namespace (None without torch)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        names = torch._C._dispatch_get_all_op_names()
    except Exception:  # an old or stripped torch: the manifest simply has no op list
        return None
    out: dict[str, set[str]] = {}
    for qualified in names:
        ns, _, op = str(qualified).partition("::")
        out.setdefault(ns, set()).add(op.split(".")[0])
    return {ns: sorted(ops) for ns, ops in sorted(out.items())}
