# The dataflow stage: runs the interpreter (walker.py) over every port function that may hold an
# LSE or a scale argument, with the contracts that say which calls produce and consume the LSE,
# and records what it sees as facts (facts.py); it makes no finding.
from __future__ import annotations

import ast
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from metax_audit.core.contracts import Contracts, Convention
from metax_audit.core.memo import NO_MEMO, Kind, Memo
from metax_audit.core.models import Location, ProbeRequest, Unresolved
from metax_audit.stages.dataflow.facts import (
    HT,
    TH,
    DataflowFacts,
    FlowEnd,
    LseFlow,
    Mismatch,
    ScaleArgument,
    ScaleCall,
    Unpacking,
    Verdict,
)
from metax_audit.stages.dataflow.memo import DataflowMemo, UnitReads
from metax_audit.stages.dataflow.module import PortModule, load_module
from metax_audit.stages.dataflow.values import GENERIC_METHODS, MAX_ALTS, Fn, Val, source_text
from metax_audit.stages.dataflow.walker import Walker

# Hand-written on `ast` rather than a library: what is needed is a small, contract-driven walk
# of function bodies (griffe gives structure, not statement-level value flow; no maintained
# Python dataflow library models tensor layouts or log bases).


@dataclass
class Recorder:
    """What the walk has seen so far, each fact once (the first visit of a place wins)."""

    flows: dict[tuple[str, str, str, str], LseFlow] = field(default_factory=dict)
    unresolved: dict[tuple[str, int, str], Unresolved] = field(default_factory=dict)
    untraced: set[tuple[str, int, str]] = field(default_factory=set)  # (path, line, param) seen untraced
    unpackings: dict[Unpacking, None] = field(default_factory=dict)  # in visit order
    scale_calls: dict[ScaleCall, None] = field(default_factory=dict)  # in visit order
    too_deep: dict[tuple[str, int], Unresolved] = field(default_factory=dict)

    def add_unresolved(self, loc: Location, text: str, reason: str) -> None:
        self.unresolved.setdefault((loc.path, loc.line, text), Unresolved(loc, text, reason))

    def merge(self, other: Recorder) -> None:
        """Add what another walk saw after what this one saw (the first visit of a place still wins)."""
        for key, flow in other.flows.items():
            self.flows.setdefault(key, flow)
        for ukey, u in other.unresolved.items():
            self.unresolved.setdefault(ukey, u)
        self.untraced |= other.untraced
        for unpacking in other.unpackings:
            self.unpackings.setdefault(unpacking, None)
        for scale in other.scale_calls:
            self.scale_calls.setdefault(scale, None)
        for dkey, deep in other.too_deep.items():
            self.too_deep.setdefault(dkey, deep)

    def add_too_deep(self, loc: Location, text: str) -> None:
        self.too_deep.setdefault((loc.path, loc.line), Unresolved(
            loc, text, f"expression too deep to analyse at {loc.path}:{loc.line}; flows through it were not followed"))


def _probe(conv: Convention, probe: str) -> ProbeRequest | None:
    """The probe that confirms a verdict about this convention's kernel, when the contract names its target."""
    if conv.probe_target and conv.probe_family:
        return ProbeRequest(conv.probe_target, conv.probe_family, (probe,))
    return None




@dataclass(frozen=True)
class ScopeEntry:
    """What the searches by name (Analysis.implementations, Analysis.global_ctor) read of one module
    in scope: a function of the file's bytes, kept under them (Analysis.load_scope)."""

    module: str
    methods: tuple[tuple[str, frozenset[str]], ...]  # each class, in the module's order, with its method names
    ctor_names: dict[str, frozenset[str]]  # PortModule.ctor_names


def scope_entry(mod: PortModule | None) -> ScopeEntry | None:
    if mod is None:
        return None
    methods = tuple((cname, frozenset(m.name for m in cls.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)))
                    for cname, cls in mod.classes.items())
    return ScopeEntry(mod.module, methods, {k: frozenset(v) for k, v in mod.ctor_names.items()})


class Analysis:
    def __init__(self, root: Path, contracts: Contracts, port_package: str, memo: Memo = NO_MEMO) -> None:
        self.root, self.contracts, self.port = root, contracts, port_package
        self.memo = memo
        self.res = Recorder()
        self._mods: dict[str, PortModule | None] = {}
        # The modules in scope: what a search by name looks through. Modules loaded later (a helper's
        # module outside the scope) are not searched, so an answer never depends on which file's walk
        # loaded what first, and each file's walk is a unit of its own (dataflow/memo.py).
        self._scope_paths: tuple[str, ...] = ()
        self._scope: tuple[ScopeEntry | None, ...] | None = None  # built on the first search (see scope())
        self._scope_cached = False
        self._impl_cache: dict[str, list[Fn]] = {}
        self._ctor_cache: dict[str, str | None] = {}
        self.log: UnitReads | None = None  # set while one file's walk runs for the memo
        tails = {p.rsplit(".", 1)[-1].strip("*").lower() for c in contracts.conventions
                 if c.role == "consumer" or c.scale_params for p in c.components}
        scale_words = {n.lower() for c in contracts.conventions for n in c.scale_params if len(n) > 5}
        self.filter_words = tuple(sorted({"lse", *scale_words, *(t for t in tails if len(t) > 3)}))

    def module(self, path: str) -> PortModule | None:
        if self.log is not None:
            self.log.files.add(path)
        if path not in self._mods:
            self._mods[path] = load_module(self.root, path)
        return self._mods[path]

    def has_file(self, path: str) -> bool:
        if self.log is not None:
            self.log.files.add(path)
        return (self.root / path).is_file()

    def load_scope(self, paths: Sequence[str], *, cached: bool = False) -> None:
        """The modules in scope: searches by name look through these only. What a search needs of
        each (ScopeEntry) is read on the first search; with `cached`, from the entries kept under
        each file's bytes, so that a review whose walks are served parses no module at all."""
        self._scope_paths = tuple(paths)
        self._scope = None
        self._scope_cached = cached

    def scope(self) -> tuple[ScopeEntry | None, ...]:
        """Each module in scope as searches see it (None: the file does not parse), in scope order."""
        if self._scope is None:
            self._scope = tuple(self._scope_entries())
        return self._scope

    def parses(self, path: str) -> bool:
        """Whether a module in scope loads (without loading it when its entry is kept)."""
        return self.scope()[self._scope_paths.index(path)] is not None

    def _scope_entries(self) -> list[ScopeEntry | None]:
        if not self._scope_cached:
            return [scope_entry(self.module(p)) for p in self._scope_paths]
        # a file's entry is a function of its bytes (its module name is its path), parsed by this interpreter
        products = self.memo.products(Kind.DATAFLOW_SCOPE, self.port, sys.version)
        out = []
        for p in self._scope_paths:
            try:
                data = (self.root / p).read_bytes()
            except OSError:
                out.append(scope_entry(self.module(p)))  # unreadable: load_module answers None, as uncached
                continue
            out.append(products.get(p, data, partial(self._entry_of, p)))
        products.save()
        return out

    def _entry_of(self, path: str) -> ScopeEntry | None:
        return scope_entry(self.module(path))

    def match(self, cands: Sequence[Fn]) -> tuple[Convention | None, Fn | None]:
        for c in cands:
            conv = self.contracts.convention_for(c.dotted)
            if conv is not None and conv.lse_base != "none":
                return conv, c
        return None, None

    def helpers_for(self, w: Walker, cands: Sequence[Fn]) -> list[tuple[PortModule, ast.FunctionDef | ast.AsyncFunctionDef, str | None]]:
        """The port functions or methods the walk may enter (one level below the analysed function)."""
        if w.depth >= 1:
            return []
        out = []
        for c in cands:
            h = self._helper(w, c)
            if h is not None and h not in out:
                out.append(h)
        return out

    def _helper(self, w: Walker, c: Fn) -> tuple[PortModule, ast.FunctionDef | ast.AsyncFunctionDef, str | None] | None:
        if not c.dotted.startswith(self.port + ".") and not c.dotted.startswith(w.mod.module + "."):
            return None
        parts = c.dotted.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            mod_name, rest = ".".join(parts[:cut]), parts[cut:]
            path = mod_name.replace(".", "/") + ".py"
            mod = w.mod if mod_name == w.mod.module else (self.module(path) if self.has_file(path) else None)
            if mod is None:
                continue
            if len(rest) == 1 and rest[0] in mod.functions:
                return mod, mod.functions[rest[0]], None
            if len(rest) == 2 and rest[0] in mod.classes:
                for m in mod.classes[rest[0]].body:
                    if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef) and m.name == rest[1]:
                        return mod, m, rest[0]
            break
        return None

    def record_scales(self, w: Walker, call: ast.Call, conv: Convention, cand: Fn) -> None:
        """The scale arguments of a call whose contract names scale parameters, as written."""
        args: list[ScaleArgument] = []
        for pname, spec in conv.scale_params.items():
            arg = next((k.value for k in call.keywords if k.arg == pname), None)
            pos = spec.get("position")
            if arg is None and isinstance(pos, int) and pos < len(call.args) and not any(
                isinstance(a, ast.Starred) for a in call.args[: pos + 1]
            ):
                arg = call.args[pos]
            if arg is None:
                continue
            form = scale_form(arg)
            args.append(ScaleArgument(pname, source_text(arg, w.mod.lines), form, FORM_WHY.get(form or "", ""), spec["form"]))
        self.res.scale_calls.setdefault(ScaleCall(
            Location(w.mod.path, call.lineno, w.qualname), cand.dotted, f"{w.mod.path}:{call.lineno}: {w.line_text(call)}",
            conv.location, conv.scale_form, tuple(args), _probe(conv, "fp8-scale")), None)

    def implementations(self, method: str) -> list[Fn]:
        """Port classes in scope defining `method`: the candidates of a call on an object whose
        class is chosen at run time (`self.impl.forward_mqa(...)`). Generic names and methods
        with many implementations are left alone: following them would guess, not resolve."""
        if method.startswith("__") or method in GENERIC_METHODS:
            return []
        if self.log is not None:
            self.log.methods.add(method)
        if method in self._impl_cache:
            return self._impl_cache[method]
        found = [
            Fn(f"{mod.module}.{cname}.{method}", via="dynamic-dispatch")
            for mod in self.scope() if mod is not None
            for cname, methods in mod.methods
            if method in methods
        ]
        self._impl_cache[method] = sorted(found, key=lambda f: f.dotted) if 0 < len(found) <= MAX_ALTS else []
        return self._impl_cache[method]

    def global_ctor(self, name: str) -> str | None:
        """A wrapper class known for an attribute name anywhere in the scope (constructor or annotation)."""
        if self.log is not None:
            self.log.ctor_names.add(name)
        if name not in self._ctor_cache:  # valid once the scope is loaded (follow loads it first)
            found: set[str] = set()
            for mod in self.scope():
                if mod is not None:
                    found |= mod.ctor_names.get(name.lstrip("_"), frozenset())
            self._ctor_cache[name] = next(iter(found)) if len(found) == 1 else None
        return self._ctor_cache[name]

    def record_unpacking(self, w: Walker, call: ast.Call, conv: Convention, cand: Fn, stmt: ast.stmt,
                         text: str | None) -> None:
        """The result is unpacked as if it held the LSE, but the call does not ask for it."""
        if conv.flag is None or conv.lse_result is None or not isinstance(stmt, ast.Assign) or stmt.value is not call:
            return
        target = stmt.targets[0]
        if not isinstance(target, ast.Tuple | ast.List) or len(target.elts) <= conv.lse_result:
            return
        lse_name = source_text(target.elts[conv.lse_result], w.mod.lines)
        switch = f"{conv.flag.name}={text}" if text is not None else f"{conv.flag.name} not passed (default {conv.flag.default})"
        self.res.unpackings.setdefault(Unpacking(
            Location(w.mod.path, call.lineno, f"{w.qualname}:{lse_name}"), cand.dotted, source_text(target, w.mod.lines),
            lse_name, conv.lse_result, switch, f"{w.mod.path}:{stmt.lineno}: {w.line_text(stmt)}", conv.location,
            conv.flag.name, conv.flag.when_true, conv.flag.when_false, tuple(conv.flag.aliases), _probe(conv, "lse")), None)

    def add_flow(self, w: Walker, call: ast.Call, conv: Convention, cand: Fn, pname: str, arg: ast.expr,
                 val: Val, base: str, flag_note: str) -> None:
        steps = [*val.steps]
        arg_text = source_text(arg, w.mod.lines)
        consumer = FlowEnd(cand.dotted, w.loc(call), base, conv.lse_layout, arg=pname, via=cand.via, convention=str(conv.location))
        reasons: list[str] = []
        verdict: Verdict = "match"
        mismatches: list[Mismatch] = []
        if val.base in ("2", "e") and base in ("2", "e"):
            if val.base != base:
                verdict = "mismatch"
                mismatches.append("base")
                reasons.append(f"base: the value is base {val.base}, {consumer.callee.rsplit('.', 1)[-1]} expects base {base}"
                               + (f" ({flag_note})" if flag_note else ""))
        else:
            verdict = "unknown"
            reasons.append(f"base: value {val.base}, consumer {base}" + (f" ({flag_note})" if flag_note else ""))
        if val.layout in (TH, HT) and conv.lse_layout in (TH, HT):
            if val.layout != conv.lse_layout:
                verdict = "mismatch"
                mismatches.append("layout")
                reasons.append(f"layout: the value is {val.layout}, the consumer reads {conv.lse_layout}")
        elif verdict == "match":
            verdict = "unknown"
            reasons.append(f"layout: value {val.layout}, consumer {conv.lse_layout}")
        probes = []
        prod_conv = self.contracts.convention_for(val.producer.callee)
        if prod_conv is not None and prod_conv.probe_target and prod_conv.probe_family:
            probes.append(ProbeRequest(prod_conv.probe_target, prod_conv.probe_family, ("lse",)))
        if conv.probe_target and conv.probe_family:
            probes.append(ProbeRequest(conv.probe_target, conv.probe_family, ("dcp", "lse")))
        flow = LseFlow(val.producer, consumer, tuple(steps), verdict, tuple(reasons), tuple(probes), tuple(mismatches))
        key = (str(val.producer.location), f"{consumer.location}|{consumer.callee}", pname, arg_text)
        self.res.flows.setdefault(key, flow)


def _relevant(mod: PortModule, fn: ast.FunctionDef | ast.AsyncFunctionDef, words: tuple[str, ...]) -> bool:
    """Cheap text filter: a function that never says "lse" nor names a consumer cannot hold a
    flow of its own (helpers it calls are still entered from the callers that need them)."""
    text = "\n".join(mod.lines[fn.lineno - 1 : fn.end_lineno]).lower()
    return any(w in text for w in words)


def _walk_path(an: Analysis, path: str) -> Recorder:
    mod = an.module(path)
    assert mod is not None  # in scope and parses (follow asks first)
    return _walk_unit(an, mod)


def _walk_unit(an: Analysis, mod: PortModule) -> Recorder:
    """One file's walk, with a recorder of its own (merged in file order by follow)."""
    outer, an.res = an.res, Recorder()
    try:
        _walk_all(an, mod)
        return an.res
    finally:
        an.res = outer


def _walk_all(an: Analysis, mod: PortModule) -> None:
    words = an.filter_words
    for fn in mod.functions.values():
        if _relevant(mod, fn, words):
            Walker(an, mod, fn, None, {}, 0).run()
    for cname, cls in mod.classes.items():
        for m in cls.body:
            if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef) and _relevant(mod, m, words):
                Walker(an, mod, m, cname, {}, 0).run()


FORM_WHY = {
    "float": "a number literal, float(...), .item() or a name ending in _float",
    "tensor": "a layer scale attribute without _float, or a torch tensor constructor",
}


def scale_form(arg: ast.expr) -> str | None:
    """float | tensor | None (cannot tell) for a scale argument, from how it is written."""
    if isinstance(arg, ast.Constant):
        return "float" if isinstance(arg.value, int | float) and not isinstance(arg.value, bool) else None
    if isinstance(arg, ast.Call):
        f = arg.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if name in ("float", "item"):
            return "float"
        if name in ("tensor", "ones", "full", "as_tensor", "empty", "zeros"):
            return "tensor"
        return None
    name = arg.attr if isinstance(arg, ast.Attribute) else arg.id if isinstance(arg, ast.Name) else ""
    if name.endswith("_float"):
        return "float"
    if re.search(r"(^|_)(k|v|kv|q)?_?scale$", name) and isinstance(arg, ast.Attribute):
        return "tensor"  # a layer's scale attribute (`layer._k_scale`) is a tensor by convention
    return None

def follow(root: Path, files: Sequence[str], contracts: Contracts, *, port_package: str,
           memo_common: list[str] | None = None, memo: Memo = NO_MEMO) -> DataflowFacts:
    """Follow every LSE from a producing kernel call to each merge/reduction argument, and record
    scale arguments and unpackings on the way. `files` are repo-relative paths under `root` (the
    snapshot). Each file's walk is a unit: with `memo_common` (what every unit depends on besides
    what it reads) a unit whose reads are unchanged is served from the dataflow memo (asked of `memo`)."""
    an = Analysis(Path(root), contracts, port_package, memo if memo_common is not None else NO_MEMO)
    paths = sorted(p for p in set(files) if p.endswith(".py"))
    # the whole scope, before any walk: name-based fallbacks must not depend on file order
    an.load_scope(paths, cached=memo_common is not None and memo.enabled)
    walks = DataflowMemo(an, memo_common, an.memo)
    total = Recorder()
    for path in paths:
        if not an.parses(path):
            total.add_unresolved(Location(path), path, "file could not be parsed; its flows were not followed")
            continue
        total.merge(walks.unit(path, partial(_walk_path, an, path)))
    an.res = total
    flows = sorted(an.res.flows.values(), key=lambda f: (f.consumer.location, f.consumer.arg, f.producer.location))
    # An argument untraced on one path (a loop's first pass) but traced on another is not unresolved.
    traced = {(f.consumer.location.path, f.consumer.location.line, f.consumer.arg) for f in flows}
    unresolved = sorted(
        (u for u in [*an.res.unresolved.values(), *an.res.too_deep.values()]
         if not any((u.location.path, u.location.line, p) in traced and f"({p}=" in u.text for p in _params_in(u.text))),
        key=lambda u: (u.location, u.text),
    )
    return DataflowFacts(tuple(flows), tuple(an.res.unpackings), tuple(an.res.scale_calls),
                         tuple(an.res.too_deep.values()), tuple(unresolved))


def _params_in(text: str) -> list[str]:
    return re.findall(r"\((\w+)=", text)
