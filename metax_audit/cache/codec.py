# The typed codec of cache entries: records (frozen dataclasses, enums, named tuples) and the builtin
# containers as JSON, decoded back only into the types named in an explicit registry; never pickle.
"""Why not pickle: a pickle in a cache directory is code that runs when it is loaded, and the cache
directory is shared, writable and long-lived. Why not a library (msgpack, cattrs): neither is a
dependency, and what the cache holds is a closed set of our own records; the stdlib json module's C
scanner does the parsing, and one `object_hook` rebuilds the tagged values.

Encoding: JSON null, booleans, numbers, strings and lists stand for themselves (lists are lists).
Every other value is a JSON object with one key, its tag:

- `{"(": [...]}` a tuple, `{"s": [...]}` a set, `{"f": [...]}` a frozenset,
- `{"d": [[k, v], ...]}` a dict (any hashable keys, insertion order kept),
- `{"p": "..."}` a Path, `{"b": "<base64>"}` bytes,
- `{"@Name": [...]}` a registered record: a dataclass's fields in `dataclasses.fields` order, a named
  tuple's items, an enum's value.

Decoding builds a dataclass without calling its __init__ (as pickle does, and several times faster):
the fields are set from the stored values. Anything unexpected (an unknown tag, a record with the
wrong number of fields, an enum value it does not have) raises CodecError: the store then treats the
entry as bad and the result is computed again. Encoding an unregistered type raises CodecError too,
and the store keeps nothing (tests/test_cache_store.py checks that every kind the demo review writes
encodes)."""

from __future__ import annotations

import base64
import dataclasses
import enum
import json
from collections.abc import Callable, Iterable
from pathlib import Path, PurePath
from typing import Any


class CodecError(ValueError):
    """A value that cannot be encoded (an unregistered type) or bytes that do not decode to records."""


_Decoder = Callable[[Any], Any]


class Registry:
    """The record types an entry may hold, each under a tag (its qualified name: unique in the tool)."""

    def __init__(self) -> None:
        self._encoders: dict[type, tuple[str, Callable[[Any], list[Any] | Any]]] = {}
        self._decoders: dict[str, _Decoder] = {}

    def add(self, *types: type) -> None:
        for cls in types:
            tag = "@" + cls.__qualname__
            if tag in self._decoders and self._tag_of(cls) != tag:
                raise ValueError(f"two record types tagged {tag}")
            if isinstance(cls, type) and issubclass(cls, enum.Enum):
                self._encoders[cls] = (tag, _enum_value)
                self._decoders[tag] = _enum_decoder(cls)
            elif dataclasses.is_dataclass(cls):
                names = tuple(f.name for f in dataclasses.fields(cls))
                self._encoders[cls] = (tag, _fields_getter(names))
                self._decoders[tag] = _dataclass_decoder(cls, names)
            elif issubclass(cls, tuple) and hasattr(cls, "_fields"):
                self._encoders[cls] = (tag, list)
                self._decoders[tag] = _namedtuple_decoder(cls)
            else:
                raise ValueError(f"{cls!r} is not a dataclass, enum or named tuple")

    def _tag_of(self, cls: type) -> str | None:
        found = self._encoders.get(cls)
        return found[0] if found else None

    def __contains__(self, cls: type) -> bool:
        return cls in self._encoders

    # ------------------------------------------------------------ encode

    def to_data(self, value: Any) -> Any:
        """`value` as JSON-able data (see the module docstring); CodecError for an unregistered type."""
        return self._enc(value)

    def _enc(self, v: Any) -> Any:
        t = type(v)
        if t is str or t is int or t is bool or v is None or t is float:
            return v
        if t is list:
            return [self._enc(x) for x in v]
        if t is tuple:
            return {"(": [self._enc(x) for x in v]}
        found = self._encoders.get(t)
        if found is not None:
            tag, parts = found
            got = parts(v)
            return {tag: [self._enc(x) for x in got] if type(got) is list else self._enc(got)}
        if t is dict:
            return {"d": [[self._enc(k), self._enc(x)] for k, x in v.items()]}
        if t is frozenset:
            return {"f": self._sorted([self._enc(x) for x in v])}
        if t is set:
            return {"s": self._sorted([self._enc(x) for x in v])}
        if isinstance(v, PurePath):
            return {"p": str(v)}
        if t is bytes:
            return {"b": base64.b64encode(v).decode("ascii")}
        raise CodecError(f"cannot keep a {t.__module__}.{t.__qualname__} in the cache (not in the registry)")

    @staticmethod
    def _sorted(items: list[Any]) -> list[Any]:
        """A set's items in a fixed order, so that one value always gives the same bytes."""
        try:
            return sorted(items, key=_order)
        except TypeError:
            return items

    def dumps(self, value: Any) -> bytes:
        """The entry payload: compact JSON, ASCII (so that a lone surrogate of a file name survives)."""
        try:
            return json.dumps(self._enc(value), separators=(",", ":"), ensure_ascii=True, allow_nan=True).encode("ascii")
        except RecursionError as exc:
            raise CodecError("value nested too deeply for the cache") from exc

    # ------------------------------------------------------------ decode

    def _hook(self, obj: dict[str, Any]) -> Any:
        if len(obj) != 1:
            raise CodecError("an object that is not a tagged value")
        ((tag, data),) = obj.items()
        try:
            if tag == "(":
                return tuple(data)
            if tag == "d":
                return {k: x for k, x in data}
            if tag == "f":
                return frozenset(data)
            if tag == "s":
                return set(data)
            if tag == "p":
                if type(data) is not str:
                    raise CodecError("a path that is not a string")
                return Path(data)
            if tag == "b":
                return base64.b64decode(data, validate=True)
            decoder = self._decoders.get(tag)
        except (TypeError, ValueError) as exc:
            raise CodecError(f"malformed {tag!r} value: {exc}") from exc
        if decoder is None:
            raise CodecError(f"unknown tag {tag[:40]!r}")
        return decoder(data)

    def loads(self, payload: bytes) -> Any:
        """The value of an entry payload; CodecError for anything that is not one."""
        try:
            return json.loads(payload, object_hook=self._hook)
        except CodecError:
            raise
        except (ValueError, TypeError, RecursionError, OverflowError, UnicodeDecodeError) as exc:
            raise CodecError(f"undecodable entry: {type(exc).__name__}") from exc


def _order(item: Any) -> str:
    return json.dumps(item, sort_keys=True)


def _enum_value(v: enum.Enum) -> Any:
    return v.value


def _fields_getter(names: tuple[str, ...]) -> Callable[[Any], list[Any]]:
    def get(v: Any) -> list[Any]:
        d = v.__dict__
        return [d[n] for n in names]

    return get


def _enum_decoder(cls: type[enum.Enum]) -> _Decoder:
    def decode(data: Any) -> Any:
        try:
            return cls(data)
        except (ValueError, TypeError) as exc:
            raise CodecError(f"{cls.__qualname__} has no value {str(data)[:40]!r}") from exc

    return decode


def _dataclass_decoder(cls: type, names: tuple[str, ...]) -> _Decoder:
    n = len(names)
    new = object.__new__

    def decode(data: Any) -> Any:
        if type(data) is not list or len(data) != n:
            raise CodecError(f"{cls.__qualname__}: wrong shape")
        obj: Any = new(cls)
        obj.__dict__.update(zip(names, data, strict=True))
        return obj

    return decode


def _namedtuple_decoder(cls: type) -> _Decoder:
    n = len(cls._fields)  # type: ignore[attr-defined]

    def decode(data: Any) -> Any:
        if type(data) is not list or len(data) != n:
            raise CodecError(f"{cls.__qualname__}: wrong shape")
        return cls(*data)

    return decode


def registry_of(types: Iterable[type]) -> Registry:
    reg = Registry()
    reg.add(*types)
    return reg
