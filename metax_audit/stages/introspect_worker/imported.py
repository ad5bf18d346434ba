# A target read by importing it in the target interpreter: the longest importable prefix, then
# attribute by attribute; signature, source, docs and the distribution it comes from.
from __future__ import annotations

import contextlib
import sys
from typing import Any

from .signatures import (
    _DOC_LINES,
    _fact,
    _kwargs_from_object,
    _params_from_signature,
    _render,
    _safe_repr,
    _short_error,
    pybind_signature,
)

# ---------------------------------------------------------------- distributions


_PACKAGES: dict[tuple[str, ...], Any] = {}  # sys.path -> packages_distributions() read along it


def _packages_distributions() -> Any:
    """importlib.metadata.packages_distributions(), read once per sys.path: it opens every installed
    distribution's RECORD, and it was asked once per target (a tenth of the worker's time)."""
    from importlib import metadata

    key = tuple(sys.path)
    if key not in _PACKAGES:
        _PACKAGES[key] = metadata.packages_distributions()
    return _PACKAGES[key]


def _dist_info(module_name: str, cache: dict[str, dict[str, str]]) -> tuple[str | None, dict[str, str] | None]:
    try:
        from importlib import metadata

        top = module_name.split(".")[0]
        names = _packages_distributions().get(top) or []
        if not names:
            return None, None
        name = names[0]
        if name not in cache:
            dist = metadata.distribution(name)
            info = {"version": dist.version or ""}
            wheel = dist.read_text("WHEEL") or ""
            tags = [ln.split(":", 1)[1].strip() for ln in wheel.splitlines() if ln.startswith("Tag:")]
            if tags:
                info["wheel_tag"] = ",".join(tags)
            if "+" in info["version"]:
                info["local_version"] = info["version"].split("+", 1)[1]
            direct = dist.read_text("direct_url.json")
            if direct:
                info["direct_url"] = direct.strip()[:300]
            cache[name] = info
        return name, cache[name]
    except Exception:
        return None, None


# ---------------------------------------------------------------- import resolution


def _import_longest(parts: list[str]) -> tuple[Any, int, str | None]:
    """Import the longest importable module prefix; (module, parts used, error) - error when it raised."""
    import importlib

    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            return importlib.import_module(name), i, None
        except ModuleNotFoundError as exc:
            # Only "this very prefix does not exist" lets us try a shorter one; a missing
            # dependency inside the package is an import error of the package.
            if exc.name is not None and (exc.name == name or name.startswith(exc.name + ".")) and i > 1:
                continue
            return None, i, _short_error(exc)
        except BaseException as exc:  # the audited package may raise anything, even SystemExit
            return None, i, _short_error(exc)
    return None, 0, f"no importable prefix of {'.'.join(parts)}"


def _torch_op_fact(target: str) -> dict[str, Any]:
    parts = target.split(".")
    try:
        import torch

        obj: Any = torch.ops
        for p in parts[2:]:
            obj = getattr(obj, p)
    except BaseException as exc:
        return _fact(target, "not-found", error=_short_error(exc))
    schemas = []
    params: list[dict[str, Any]] | None = None
    try:
        overloads = obj.overloads() if hasattr(obj, "overloads") else []
        packets = [getattr(obj, ov) for ov in overloads] or [obj]
        for pk in packets:
            schema = getattr(pk, "_schema", None)
            if schema is None:
                continue
            schemas.append(str(schema))
            if params is None:
                params = [{"name": a.name, "kind": "KEYWORD_ONLY" if a.kwarg_only else "POSITIONAL_OR_KEYWORD",
                           "default": None if a.default_value is None and not a.has_default_value() else _safe_repr(a.default_value)}
                          for a in schema.arguments]
    except BaseException as exc:
        return _fact(target, "no-signature", error=_short_error(exc))
    if not schemas:
        return _fact(target, "no-signature", error="torch op without a schema")
    return _fact(target, "ok", signature=" | ".join(schemas), params=params, doc=None)


def introspect_target(target: str, dist_cache: dict[str, dict[str, str]]) -> dict[str, Any]:
    import inspect

    if target.startswith("torch.ops."):
        return _torch_op_fact(target)
    parts = target.split(".")
    module, used, error = _import_longest(parts)
    if module is None:
        return _fact(target, "import-error", error=error)
    obj: Any = module
    owner: Any = None
    for i, name in enumerate(parts[used:]):
        owner = obj
        try:
            obj = inspect.getattr_static(obj, name) if inspect.isclass(obj) else getattr(obj, name)
        except AttributeError:
            try:
                obj = getattr(owner, name)
            except BaseException:
                missing = ".".join(parts[: used + i + 1])
                return _fact(target, "not-found", error=f"{missing} does not exist in {'.'.join(parts[: used + i])}",
                             sourcefile=_sourcefile(owner), **_dist_kw(module.__name__, dist_cache))
        except BaseException as exc:
            return _fact(target, "crash", error=_short_error(exc))
    return _describe(target, obj, owner, module.__name__, dist_cache)


def _dist_kw(module_name: str, cache: dict[str, dict[str, str]]) -> dict[str, Any]:
    name, info = _dist_info(module_name, cache)
    if not name or not info:
        return {}
    return {"distribution": name, "version": info.get("version"), "wheel_tag": info.get("wheel_tag")}


def _sourcefile(obj: Any) -> str | None:
    import inspect

    try:
        return inspect.getsourcefile(obj)
    except Exception:
        return None


def _describe(target: str, obj: Any, owner: Any, module_name: str, dist_cache: dict[str, dict[str, str]]) -> dict[str, Any]:
    import functools
    import inspect

    bound_method = False
    if inspect.isclass(owner):
        if isinstance(obj, staticmethod):
            obj = obj.__func__
        elif isinstance(obj, classmethod):
            obj, bound_method = obj.__func__, True
        elif isinstance(obj, property):
            obj = obj.fget
        elif inspect.isfunction(obj) or inspect.ismethoddescriptor(obj):
            bound_method = True  # called through an instance: `self` is not passed by the caller
    kw: dict[str, Any] = _dist_kw(module_name, dist_cache)
    inner = obj
    while isinstance(inner, functools.partial):
        inner = inner.func
    with contextlib.suppress(Exception):
        inner = inspect.unwrap(inner)
    if inspect.isclass(inner):
        init = getattr(inner, "__init__", None)
        inner_code = init if init is not None and init is not object.__init__ else inner
    else:
        inner_code = inner
    kw["sourcefile"] = _sourcefile(inner)
    with contextlib.suppress(Exception):
        kw["line"] = inspect.getsourcelines(inner)[1]
    doc = inspect.getdoc(obj) or (inspect.getdoc(inner) if inner is not obj else None)
    if doc and not (inspect.ismodule(obj)):
        kw["doc"] = "\n".join(doc.strip().splitlines()[:_DOC_LINES])
    if inspect.ismodule(obj):
        return _fact(target, "ok", kind="module", **kw)
    try:
        sig = inspect.signature(obj)  # follows __wrapped__ and applies functools.partial
        params = _params_from_signature(sig)
        if bound_method and params and params[0]["kind"] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD"):
            params = params[1:]
        kw["signature"] = _render(params)
        kw["params"] = params
    except (ValueError, TypeError) as exc:
        name = getattr(obj, "__name__", target.rsplit(".", 1)[-1])
        parsed = pybind_signature(name, getattr(obj, "__doc__", None))
        if parsed is None and inspect.isclass(obj):  # pybind11 classes document __init__ instead
            parsed = pybind_signature("__init__", getattr(getattr(obj, "__init__", None), "__doc__", None))
        if parsed is None:
            return _fact(target, "no-signature", error=_short_error(exc), **kw)
        kw["signature"], kw["params"] = parsed[0], parsed[1]
        kw["signature_from"] = "pybind-docstring"
    if inner is not obj or isinstance(obj, functools.partial):
        kw["wrapped"] = f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__qualname__', '?')}"
    usage = _kwargs_from_object(inner_code)
    if usage is not None:
        kw["kwargs_reads"], kw["kwargs_forwarded"] = usage
    return _fact(target, "ok", **kw)
