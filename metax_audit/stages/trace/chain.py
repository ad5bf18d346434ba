# The per-backend chain: registration -> backend -> builder/metadata -> impl -> wrappers -> kernels,
# plus the layer binding, every call site reached, and what could not be resolved (as data).
from __future__ import annotations

import ast
from dataclasses import replace
from functools import partial
from pathlib import Path

from metax_audit.core.config import AuditConfig
from metax_audit.core.memo import NO_MEMO, Memo
from metax_audit.core.models import (
    BackendChain,
    CallSite,
    ChainHop,
    Discovery,
    Location,
    Registration,
    TraceResult,
    Unresolved,
    UnresolvedKind,
)
from metax_audit.core.pysource import ast_walk
from metax_audit.stages.trace.calls import Budget, Classifier, Collected, Walker, is_triton_kernel
from metax_audit.stages.trace.memo import MemoCount, TraceMemo, UnitResult
from metax_audit.stages.trace.modules import ModuleIndex, Skip
from metax_audit.stages.trace.resolve import Resolver
from metax_audit.stages.trace.symbols import SymbolTable
from metax_audit.stages.trace.values import Cls, Ext, Func, Inst, Layer, Partial, Scope, Val, known

BACKEND_KINDS = frozenset({"attention-backend", "mla-prefill"})
KERNEL_PACKAGES = frozenset({"flashinfer", "flash_attn", "flash_mla", "triton"})
IMPL_ENTRIES = ("__init__", "forward", "do_kv_cache_update", "process_weights_after_loading")
BUILDER_ENTRIES = ("__init__", "build", "build_for_cudagraph_capture")
CAPTURE_ATTRS = ("_cudagraph_support", "cudagraph_support")


def _backend_registrations(registrations: tuple[Registration, ...]) -> list[Registration]:
    """Call registrations, plus `@register_backend` decorators that no call registration repeats.

    The real port often has both for one backend (same class path); tracing it twice would
    double every finding, while a decorator-only backend must still be traced.
    """
    chosen = [r for r in registrations if r.kind in BACKEND_KINDS]
    seen = {(r.name, r.class_path) for r in chosen} | {r.name for r in chosen if r.kind == "attention-backend"}
    for r in registrations:
        if r.kind == "decorator" and "." not in r.class_path:
            continue  # `@register_backend(E.X, "NAME")` registers a string, not a class (a registration finding)
        if r.kind == "decorator" and (r.name, r.class_path) not in seen and r.name not in seen:
            chosen.append(replace(r, kind="attention-backend"))
            seen.add(r.name)
    return chosen


class _Tracer:
    def __init__(self, discovery: Discovery, config: AuditConfig, upstream_root: Path | None, symbols: SymbolTable | None = None,
                 memo_common: list[str] | None = None, memo_count: MemoCount | None = None, memo: Memo = NO_MEMO,
                 only_functions: frozenset[str] | None = None) -> None:
        self.discovery = discovery
        self.only_functions = only_functions  # the file-wide call sites of functions and methods of these names only
        self.config = config
        if symbols is None:
            symbols = SymbolTable(ModuleIndex(Path(discovery.root), config.port_package, upstream_root, config.upstream_package, config.max_file_bytes))
        self.index = symbols.index
        tops = {p.replace("-", "_").split("_python")[0] for p in config.kernel_packages} | KERNEL_PACKAGES
        self._kernel_tops = frozenset(tops - {"torch"})
        self._fresh_resolver()
        # Without a key (no cache) the memo computes every unit, with the same per-unit resolvers.
        self.memo = TraceMemo(self.index, memo_common or [], memo=memo if memo_common is not None else NO_MEMO)
        if memo_count is not None:
            self.memo.count = memo_count

    def _fresh_resolver(self) -> None:
        """Each unit of the trace (a backend, a file's context-free calls) resolves with a resolver of
        its own: its result then depends on what it reads, never on which unit ran before it (the
        resolver's memo and the attribute assignments it records are per unit), so a unit's stored
        result is exactly what tracing it again would give (trace/memo.py)."""
        self.r = Resolver(self.index)
        self.classifier = Classifier(self.r, self._kernel_tops)

    # ---- helpers

    def _origin_tag(self, owner: Cls | None, cls: Cls) -> str | None:
        if owner is None or owner == cls:
            return None
        return f"{owner.info.origin}:{owner.dotted}"

    def method(self, cls: Cls, name: str, role: str, hops: list[ChainHop]) -> Func | None:
        for v in known(self.r.class_member(cls, name, Inst(cls))):
            if isinstance(v, Func):
                hops.append(ChainHop(role, v.dotted, v.info.path, v.node.lineno, v.dotted, self._origin_tag(v.owner, cls)))
                return v
            if isinstance(v, Ext):
                base = v.dotted.rpartition(".")[0]
                if self.classifier.origin(base) == "builtin":
                    return None  # object/NamedTuple plumbing is not a chain hop
                hops.append(ChainHop(role, v.dotted, "", 0, v.dotted, f"{self.classifier.origin(base)}:{base}"))
                return None
        return None

    def classes_returned(self, fn: Func) -> list[Cls]:
        return [v if isinstance(v, Cls) else v.cls for v in self.r.returns(fn) if isinstance(v, Cls) or (isinstance(v, Inst) and isinstance(v.cls, Cls))]  # type: ignore[misc]

    def metadata_class(self, builder: Cls, build: Func | None) -> Cls | None:
        for c in self.r.mro(builder):
            if not isinstance(c, Cls):
                continue
            for b in c.node.bases:
                if isinstance(b, ast.Subscript):
                    for v in self.r.eval(b.slice, Scope.of(c.info, None)):
                        if isinstance(v, Cls):
                            return v
        if build is not None:
            for v in self.r.returns(build):
                if isinstance(v, Inst) and isinstance(v.cls, Cls):
                    return v.cls
        return None

    def capture_support(self, classes: list[Cls]) -> str | None:
        for cls in classes:
            for c in self.r.mro(cls):
                if not isinstance(c, Cls):
                    continue
                for item in c.node.body:
                    if isinstance(item, ast.Assign | ast.AnnAssign) and item.value is not None:
                        names = [t.id for t in (item.targets if isinstance(item, ast.Assign) else [item.target]) if isinstance(t, ast.Name)]
                        if any(n in CAPTURE_ATTRS for n in names):
                            return ast.unparse(item.value)
                    if isinstance(item, ast.FunctionDef) and item.name == "get_cudagraph_support":
                        rets = [ast.unparse(r.value) for r in ast_walk(item) if isinstance(r, ast.Return) and r.value is not None]
                        if rets:
                            return " | ".join(dict.fromkeys(rets))
        return None

    def is_active(self, reg: Registration) -> bool:
        if reg.selected_by:
            return True  # the platform's selector returns it (under reg.condition)
        for plist in self.discovery.priorities:
            members = {m.rsplit(".", 1)[-1] for m in plist.members}
            off = {m.rsplit(".", 1)[-1] for m in plist.commented_out}
            if reg.name in members and reg.name not in off:
                return True
        if reg.kind != "attention-backend":
            return any(s.value.rsplit(".", 1)[-1] == reg.name for s in self.discovery.switches)
        return False

    # ---- one backend

    def trace_unit(self, reg: Registration) -> tuple[BackendChain, UnitResult]:
        """One backend's chain, from the memo or traced now with a fresh resolver."""
        def compute() -> tuple[BackendChain, UnitResult]:
            self._fresh_resolver()
            return self.trace(reg)

        chain, result = self.memo.unit(["backend", repr(reg)], compute)
        # Whether the platform lists it is read from the discovery, outside the unit.
        return replace(chain, active=self.is_active(reg)), result

    def trace(self, reg: Registration) -> tuple[BackendChain, UnitResult]:
        hops = [ChainHop("registration", reg.name, reg.location.path, reg.location.line, reg.class_path)]
        unresolved: list[Unresolved] = []
        vals = known(self.r.lookup(reg.class_path))
        backend = next((v for v in vals if isinstance(v, Cls)), None)
        if backend is None:
            # discover reports the dangling class path (a registration finding); the chain stops here.
            hops.append(ChainHop("backend", reg.class_path, "", 0, None))
            return (BackendChain(reg.name, reg.class_path, reg.location, self.is_active(reg), tuple(hops), (), tuple(unresolved),
                                 condition=reg.condition), UnitResult(frozenset(), frozenset(), ()))
        hops.append(ChainHop("backend", backend.dotted, backend.info.path, backend.node.lineno, backend.dotted))
        out = Collected()
        walker = Walker(self.r, self.classifier, out, Budget())
        entries: list[tuple[Func, dict, Cls]] = []
        builder = impl = None
        self._meta: Cls | None = None
        if reg.kind == "attention-backend":
            builder = self._builder(backend, hops, entries)
            gi = self.method(backend, "get_impl_cls", "get-impl-cls", hops)
            if gi is not None:
                impl = next(iter(self.classes_returned(gi)), None)
        else:
            impl = backend  # an MLA prefill backend is its own implementation
        if impl is not None:
            self._impl_entries(impl, backend, hops, entries)
        kv_methods = (("get_kv_cache_shape", "kv-cache-shape"), ("get_kv_cache_stride_order", "kv-stride-order"))
        for name, role in kv_methods if reg.kind == "attention-backend" else ():
            f = self.method(backend, name, role, hops)
            if f is not None:
                entries.append((f, {}, backend))
        for fn, bindings, looked_up_on in entries:
            # self is the chain's class, not the base that defines the method: overrides win.
            try:
                walker.walk(replace(fn, bound=Inst(looked_up_on)), bindings)
            except RecursionError:
                # Pathologically nested code (usually generated): keep what was found, say where it stopped.
                unresolved.append(Unresolved(Location(fn.info.path, fn.node.lineno, fn.dotted), fn.dotted, "not fully traced: code nested too deeply"))
        hops.extend(self._wrapper_hops(out))
        calls = tuple(sorted(out.calls.values(), key=lambda c: (c.location.path, c.location.line)))
        hops.extend(self._kernel_hops(calls))
        for attr, (path, line) in sorted(out.layer_reads.items(), key=lambda kv: kv[1]):
            hops.append(ChainHop("layer", f"layer.{attr}", path, line))
        resolved_at = {(c.location.path, c.location.line) for c in calls if c.origin != "unresolved"}
        unresolved += [u for u in out.unresolved.values() if (u.location.path, u.location.line) not in resolved_at]
        capture = self.capture_support([c for c in (builder, backend, impl) if c is not None])
        return (BackendChain(reg.name, reg.class_path, reg.location, self.is_active(reg), tuple(hops), calls, tuple(unresolved), capture,
                             condition=reg.condition), UnitResult(frozenset(out.files), frozenset(out.walked), ()))

    def _builder(self, backend: Cls, hops: list[ChainHop], entries: list[tuple[Func, dict, Cls]]) -> Cls | None:
        """The metadata builder get_builder_cls returns, with its hop, its entry methods (into
        `entries`) and the metadata class its build returns (self._meta)."""
        gb = self.method(backend, "get_builder_cls", "get-builder-cls", hops)
        builder = next(iter(self.classes_returned(gb)), None) if gb is not None else None
        if builder is None:
            return None
        hops.append(ChainHop("builder", builder.dotted, builder.info.path, builder.node.lineno, builder.dotted))
        build = None
        for name in BUILDER_ENTRIES:
            f = self.method(builder, name, "build" if name == "build" else f"builder.{name.strip('_')}", hops)
            if f is not None:
                entries.append((f, {}, builder))
                build = f if name == "build" else build
        meta = self.metadata_class(builder, build)
        self._meta = meta
        if meta is not None:
            hops.append(ChainHop("metadata", meta.dotted, meta.info.path, meta.node.lineno, meta.dotted))
        return builder

    def _impl_entries(self, impl: Cls, backend: Cls, hops: list[ChainHop], entries: list[tuple[Func, dict, Cls]]) -> None:
        """The impl's hop and its entry methods (forward and the other forward* of its port classes;
        every public method when the backend is its own impl), into `entries`."""
        hops.append(ChainHop("impl", impl.dotted, impl.info.path, impl.node.lineno, impl.dotted))
        names = list(IMPL_ENTRIES)
        for c in self.r.mro(impl):
            if isinstance(c, Cls) and c.info.origin == "port":
                names += [i.name for i in c.node.body if isinstance(i, ast.FunctionDef) and (i.name.startswith("forward") or (impl is backend and not i.name.startswith("_")))]
        for name in dict.fromkeys(names):
            f = self.method(impl, name, name.strip("_") if name in IMPL_ENTRIES[:2] else f"impl.{name}", hops)
            if f is not None:
                entries.append((f, self._layer_binding(f), impl))

    def _layer_binding(self, fn: Func) -> dict:
        """What the framework passes to impl methods: the attention layer, and (when the
        parameter is not annotated) the metadata object the chain's builder builds."""
        a = fn.node.args
        params = [p for p in [*a.posonlyargs, *a.args]][1:]
        names = [p.arg for p in params]
        out: dict = {}
        if "layer" in names:
            out["layer"] = (Layer(),)
        elif fn.node.name == "forward" and names:
            out[names[0]] = (Layer(names[0]),)
        meta = next((p for p in params if p.arg == "attn_metadata"), None)
        if meta is not None and meta.annotation is None and self._meta is not None:
            out["attn_metadata"] = (Inst(self._meta),)
        return out

    def _wrapper_hops(self, out: Collected) -> list[ChainHop]:
        hops = []
        seen: set[str] = set()
        for (owner, attr), (vals, path, line) in out.self_attrs.items():
            for v in vals:
                target = self._instance_class(v)
                if target is None or target in seen:
                    continue
                seen.add(target)
                hops.append(ChainHop("wrapper", f"{owner.rsplit('.', 1)[-1]}.{attr}", path, line, target))
        return hops

    def _instance_class(self, v: Val) -> str | None:
        if isinstance(v, Partial):
            d = getattr(v.func, "dotted", None)
            return f"functools.partial({d})" if d else None
        if not isinstance(v, Inst):
            return None
        if isinstance(v.cls, Cls):
            return v.cls.dotted if v.cls.info.origin == "port" else None
        origin = self.classifier.origin(v.cls.dotted)
        return v.cls.dotted if origin == "external" else None

    def _kernel_hops(self, calls: tuple[CallSite, ...]) -> list[ChainHop]:
        hops = []
        seen: set[str] = set()
        for c in calls:
            if c.resolved is None or c.resolved in seen or not is_kernel_call(c):
                continue
            seen.add(c.resolved)
            hops.append(ChainHop("kernel", c.callee_text, c.location.path, c.location.line, c.resolved))
        return hops

    # ---- whole run

    def run(self) -> TraceResult:
        self._files: set[str] = set()
        self._walked: set[str] = set()
        skips: dict[str, Skip] = {}
        traced = []
        for reg in _backend_registrations(self.discovery.registrations):
            chain, result = self.trace_unit(reg)
            traced.append(chain)
            self._files |= result.files
            self._walked |= result.walked
            skips.update((s.path, s) for s in result.skips)
        chains = tuple(traced)
        scope_calls = self._scope_calls(skips)
        all_calls: dict[tuple, CallSite] = {}
        for ch in chains:
            for c in ch.calls:
                all_calls.setdefault((c.location.path, c.location.line, c.callee_text, c.resolved), c)
        for c in scope_calls:
            all_calls.setdefault((c.location.path, c.location.line, c.callee_text, c.resolved), c)
        in_scope = {f.path for f in self.discovery.files}
        reached = tuple(sorted(p for p in self._files if p not in in_scope and p.startswith(self.config.port_package.split(".")[0].replace(".", "/"))))
        unresolved: dict[tuple, Unresolved] = {}
        for ch in chains:
            for u in ch.unresolved:
                unresolved.setdefault((u.location.path, u.location.line, u.text), u)
        for skip in skips.values():
            loc = Location(skip.path, 0)
            unresolved.setdefault((skip.path, 0, ""), Unresolved(loc, skip.path, f"file not traced: {skip.reason}",
                                                                         UnresolvedKind.FILE_NOT_TRACED))
        return TraceResult(chains, reached, tuple(sorted(all_calls.values(), key=lambda c: (c.location.path, c.location.line))), tuple(unresolved.values()))

    @staticmethod
    def _guarded(walker: Walker, fn: Func) -> None:
        try:
            walker.walk(fn)
        except RecursionError:
            walker.out.unresolved.setdefault((fn.info.path, fn.node.lineno, fn.dotted), Unresolved(Location(fn.info.path, fn.node.lineno, fn.dotted), fn.dotted, "not fully traced: code nested too deeply"))

    def _scope_calls(self, skips: dict[str, Skip]) -> list[CallSite]:
        """Every call written in the files in scope, context-free (the compare stage checks them all).

        One memo unit per file: its top-level functions and methods that no chain walked."""
        sites: list[CallSite] = []
        for sf in self.discovery.files:
            if sf.parse_error or not sf.path.endswith(".py"):
                continue
            module = _module_name(sf.path)
            walked = sorted(w for w in self._walked if w.startswith(module + "."))
            key = ["scope", sf.path, walked] + ([] if self.only_functions is None else [sorted(self.only_functions)])
            found, result = self.memo.unit(key, partial(self._file_scope_calls, sf.path))
            sites += found
            skips.update((s.path, s) for s in result.skips)
        return sites

    def _file_scope_calls(self, path: str) -> tuple[list[CallSite], UnitResult]:
        self._fresh_resolver()
        out = Collected()
        walker = Walker(self.r, self.classifier, out, Budget(max_depth=0, max_functions=20_000), follow_upstream_methods=False, record_attrs=False)
        info = self.index.module_for_path(path)
        only = self.only_functions

        def wanted(fn: ast.stmt, dotted: str) -> bool:
            # Functions a chain walked already have their (more precise) call sites. With only_functions the
            # others need not be walked: each function is walked alone (no callee is followed).
            return (isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and dotted not in self._walked
                    and (only is None or fn.name in only))

        if info is not None:
            for node in info.tree.body:
                # Triton kernel bodies are device DSL (tl.*): their launches are the call sites.
                if is_triton_kernel(node):
                    continue
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    if wanted(node, f"{info.name}.{node.name}"):
                        self._guarded(walker, Func(f"{info.name}.{node.name}", info, node))
                elif isinstance(node, ast.ClassDef):
                    cls = Cls(f"{info.name}.{node.name}", info, node)
                    for item in node.body:
                        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and wanted(item, f"{cls.dotted}.{item.name}"):
                            self._guarded(walker, Func(f"{cls.dotted}.{item.name}", info, item, owner=cls, bound=Inst(cls)))
        sites = list(out.calls.values())
        done = {(c.location.path, c.location.line) for c in sites}
        for u in out.unresolved.values():
            if (u.location.path, u.location.line) not in done:
                sites.append(CallSite(u.location, u.location.symbol, u.text, None, "unresolved", via=f"unresolved: {u.reason}"))
        return sites, UnitResult(frozenset(), frozenset(), ())


def _module_name(rel: str) -> str:
    """The dotted name ModuleIndex.module_for_path gives a repo-relative path."""
    parts = list(Path(rel).with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def is_kernel_call(c: CallSite) -> bool:
    """A call into a kernel package, torch.ops, a Triton launch, or an `ops`/`*_ops` module of port/upstream."""
    if c.resolved is None or c.origin in {"builtin", "unresolved"}:
        return False
    if c.via == "kernel-launch":
        return True
    if "<locals>" in c.resolved or c.resolved.rsplit(".", 1)[-1].startswith("_"):
        return False  # local and private helpers of an ops module are plumbing, not entry points
    if c.origin == "external":
        # triton.cdiv and friends are helpers; Triton kernels are caught as launches above.
        return not c.resolved.startswith("triton.")
    modules = c.resolved.split(".")[:-1]
    return c.origin in {"port", "upstream"} and any(m == "ops" or m.endswith("_ops") for m in modules)


def trace_backends(discovery: Discovery, config: AuditConfig, upstream_root: Path | None = None,
                   symbols: SymbolTable | None = None, memo_common: list[str] | None = None,
                   memo_count: MemoCount | None = None, memo: Memo = NO_MEMO,
                   only_functions: frozenset[str] | None = None) -> TraceResult:
    """Trace every registered attention backend (and MLA prefill backend) of the snapshot, by ast only.

    With `symbols` the trace reads through the review's one module index (which the checks ask
    afterwards, reusing every module parsed here); without, it builds its own over `upstream_root`.
    With `memo_common` (what every unit depends on besides its own reads: the upstream release and
    the config) each backend's chain and each file's call sites are asked of `memo` (the review's keeps
    them between reviews); `memo_count` receives how many were served from it. With `only_functions` the
    file-wide call sites are those of the functions and methods of these names alone."""
    return _Tracer(discovery, config, upstream_root, symbols, memo_common, memo_count, memo, only_functions).run()
