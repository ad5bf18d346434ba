# Rule `import`: a name the port imports from an external kernel package that the installed (or
# manifest) package does not provide, private names included. Reads the port's ast from the snapshot.
from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from metax_audit.core.findings import make_finding, rule
from metax_audit.core.models import Category, Discovery, Finding, Location, Severity, Site, StackFacts
from metax_audit.core.pysource import (
    ImportedName,
    ast_children,
    ast_walk,
    file_imported_names,
    imported_names,
    module_name,
    read_source_cached,
    walk_nodes,
)
from metax_audit.core.versions import branch_taken
from metax_audit.stages.checks.memo import FileMemo
from metax_audit.stages.checks.stack import build_note, source_line
from metax_audit.stages.trace.modules import ModuleInfo
from metax_audit.stages.trace.symbols import NameAnswer, Provider, Status, SymbolTable, absolute_module

if TYPE_CHECKING:
    from metax_audit.stages.trace.memo import TraceMemo, UnitResult

rule("MXA120", Category.IMPORT, Severity.ERROR, "port imports a name the installed kernel package does not provide",
     "Importing the module fails with ImportError (or AttributeError on use) against the installed package. "
     "Private names (leading underscore) move between releases without notice: vendor the helper or pin the kernel.")
rule("MXA121", Category.IMPORT, Severity.INFO, "imported name could not be checked against the installed kernel package",
     "Introspection could not import or read the package; this is not evidence the name is missing.")


def check_imports(discovery: Discovery, facts: StackFacts, memo: FileMemo | None = None) -> Iterator[Finding]:
    """Check every port import whose target introspection has a fact for (see imported_names; each
    file's imports are a function of its bytes and the packages asked for: kept per file in `memo`)."""
    tops = sorted({t.split(".")[0] for t in facts.facts})
    paths = [f.path for f in discovery.files if f.parse_error is None]
    unchecked: dict[str, list[ImportedName]] = {}
    missing: dict[str, list[ImportedName]] = {}
    per_file: dict[str, dict[int, str]] = {}  # the enclosing functions of a file's imports, read once
    if memo is None:
        imports = imported_names(discovery.root, paths, tops)
    else:
        unit = ("imported-names", *tops)
        imports = sorted((i for rel in paths for i in memo.get(rel, unit, partial(file_imported_names, discovery.root, rel, tops))),
                         key=lambda i: (i.path, i.line))
    for imp in imports:
        fact = facts.facts.get(imp.target)
        if fact is None:
            continue
        if fact.status == "not-found":
            missing.setdefault(imp.target, []).append(imp)  # one finding per missing name, every site in it
        elif fact.status != "ok":
            unchecked.setdefault(imp.module.split(".")[0], []).append(imp)
    for target, imps in missing.items():
        fact = facts.facts[target]
        first = imps[0]
        severity = None
        notes = [f"lookup: {fact.error}" if fact.error else "lookup failed", *build_note(fact)]
        if fact.source == "static":
            severity = Severity.WARNING  # a dynamic export is invisible to a static read
            notes.append("read statically from source; a runtime-only export would not be seen")
        if all(i.guarded for i in imps):
            # A guarded import is the port saying the name may be absent: the guard is the evidence, and the
            # fallback is what runs on this stack (info, never an import error).
            severity = Severity.INFO
            notes.append("guarded: every import sits in a try/except ImportError; the fallback path is what runs on this stack")
        dist = " ".join(x for x in (fact.distribution, fact.version) if x)
        what = f"{first.name!r} from {first.module}" if first.name else f"module {first.module}"
        more = f" (and {len(imps) - 1} more import site(s))" if len(imps) > 1 else ""
        functions = [_import_functions(discovery.root, i.path, per_file).get(i.line, "") for i in imps]
        lines = [f"port: {i.path}:{i.line}: {source_line(discovery.root, i.path, i.line)}" + (f"  (lazy, in {fn})" if fn else "")
                 for i, fn in list(zip(imps, functions, strict=True))[:8]]
        if severity is not Severity.INFO:
            # where it fails: one unguarded import at module level stops the module; lazy ones fail when their function runs
            lazy = next((fn for fn in functions if fn), "")
            at_import = any(not fn and not i.guarded for i, fn in zip(imps, functions, strict=True))
            notes.append("unguarded: importing the module fails" if at_import or not lazy else f"fails when {lazy} runs")
        yield make_finding("MXA120", Location(first.path, first.line, f"import:{target}"),
                           f"imports {what}, which installed {dist or first.module.split('.')[0]} does not provide{more}",
                           [*lines, f"installed: {target} missing  [{fact.source}{' via ' + facts.source if facts.source.startswith('manifest:') else ''}{', ' + dist if dist else ''}]", *notes],
                           severity=severity,
                           sites=[Site(i.path, i.line, "", "import", source_line(discovery.root, i.path, i.line)) for i in imps])
    for top, imps in unchecked.items():
        first = imps[0]
        fact = facts.facts[first.target]
        yield make_finding("MXA121", Location(first.path, first.line, f"import:{top}:not-checked"),
                           f"{len(imps)} import(s) from {top} not checked: introspection says {fact.status}",
                           [f"fact: {fact.target} status={fact.status}: {fact.error or ''}",
                            *(f"port: {i.path}:{i.line}: import {i.target}" for i in imps[:10])])


def _import_functions(root: Path, path: str, per_file: dict[str, dict[int, str]]) -> dict[int, str]:
    """Line of each import statement of the snapshot file -> the function it sits in ("" where it runs at import), as
    import_sites reads it; none when the file cannot be read. Kept in `per_file`."""
    if path not in per_file:
        src = read_source_cached(root, path, 5_000_000)
        per_file[path] = {} if src.tree is None or src.text is None else {
            s.line: s.function for s in import_sites(
                ModuleInfo(module_name(path), path, "port", path.endswith("__init__.py"), src.tree, src.text), path)}
    return per_file[path]


# ---------------------------------------------------------------- port and upstream imports

rule("MXA122", Category.IMPORT, Severity.ERROR, "port imports a module or name that its provider does not define",
     "The import resolves against the port snapshot or the upstream release the port declares, and the module or the "
     "name is not there (nor re-exported, nor provided by a module __getattr__): importing the module raises "
     "ImportError, a lazy import fails when its function runs. One finding per missing name; the other import sites "
     "and the uses that fail with it are in the evidence. A try/except ImportError or an availability check lowers it "
     "to info with the guard as evidence (the port expects the name may be absent; the fallback runs), a "
     "TYPE_CHECKING-only import used only in annotations to info too.")


@dataclass(frozen=True)
class Guard:
    kind: str  # "try" | "type-checking" | "if"
    text: str  # the condition, or the except clause with its fallback
    reraises: bool = False


@dataclass(frozen=True)
class ImportSite:
    path: str
    line: int
    module: str  # absolute module
    name: str | None  # None for `import module`
    local: str  # the name it binds in the importing scope
    function: str  # enclosing function ("" at module level)
    guards: tuple[Guard, ...]


_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


def _handler_catches(h: ast.ExceptHandler) -> bool:
    if h.type is None:
        return True
    names = [h.type] if not isinstance(h.type, ast.Tuple) else list(h.type.elts)
    return any(ast.unparse(n).rsplit(".", 1)[-1] in _IMPORT_ERRORS for n in names)


def _try_guard(node: ast.Try) -> Guard | None:
    handlers = [h for h in node.handlers if _handler_catches(h)]
    if not handlers:
        return None
    h = handlers[0]
    body = [s for s in h.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    reraises = any(isinstance(s, ast.Raise) for s in body) and not any(isinstance(s, ast.Assign | ast.ClassDef | ast.FunctionDef | ast.Import | ast.ImportFrom) for s in body)
    fallback = "; ".join(ast.unparse(s).splitlines()[0] for s in body[:2]) or "pass"
    what = ast.unparse(h.type) if h.type is not None else "(bare)"
    return Guard("try", f"except {what}: {fallback}", reraises)


# A condition that asks whether something can be had: has_flashinfer(), is_torch_npu_available(), find_spec(...).
_AVAILABILITY = re.compile(r"\b(has_\w+|\w*_available|is_available|find_spec|find_loader)\s*\(|\bHAS_\w+|\w+_AVAILABLE\b")


def _is_type_checking(test: ast.expr) -> bool:
    """`TYPE_CHECKING` or `typing.TYPE_CHECKING` (what unparsing the test would say, without unparsing it)."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING" and isinstance(test.value, ast.Name)
            and test.value.id == "typing")


def import_sites(info: ModuleInfo, path: str) -> list[ImportSite]:
    """Every import of a module (module level, in functions, lazy, conditional) with its guards."""
    out: list[ImportSite] = []

    def visit(stmts: list[ast.stmt], guards: tuple[Guard, ...], function: str, prefix: str = "") -> None:
        # function: the enclosing def ("" while the code runs at import); prefix: its qualname so far
        for st in stmts:
            if isinstance(st, ast.Import):
                for a in st.names:
                    out.append(ImportSite(path, st.lineno, a.name, None, a.asname or a.name.split(".")[0], function, guards))
            elif isinstance(st, ast.ImportFrom):
                mod = absolute_module(info, st)
                for a in st.names:
                    if a.name != "*":
                        out.append(ImportSite(path, st.lineno, mod, a.name, a.asname or a.name, function, guards))
            elif isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(st.body, guards, prefix + st.name, prefix + st.name + ".")
            elif isinstance(st, ast.ClassDef):
                visit(st.body, guards, function, prefix + st.name + ".")  # a class body runs at import
            elif isinstance(st, ast.If):
                if _is_type_checking(st.test):
                    visit(st.body, (*guards, Guard("type-checking", "if TYPE_CHECKING")), function, prefix)
                    visit(st.orelse, guards, function, prefix)
                else:
                    test = ast.unparse(st.test)
                    visit(st.body, (*guards, Guard("if", f"if {test}")), function, prefix)
                    visit(st.orelse, (*guards, Guard("if", f"if not ({test})")), function, prefix)
            elif isinstance(st, ast.Try | ast.TryStar):
                g = _try_guard(st)  # type: ignore[arg-type]
                visit(st.body, (*guards, g) if g else guards, function, prefix)
                for h in st.handlers:
                    visit(h.body, guards, function, prefix)
                visit(st.orelse, guards, function, prefix)
                visit(st.finalbody, guards, function, prefix)
            else:
                for block in ("body", "orelse", "finalbody"):
                    sub = getattr(st, block, None)
                    if isinstance(sub, list):
                        visit(sub, guards, function, prefix)
                for case in getattr(st, "cases", []) or []:
                    visit(case.body, guards, function, prefix)

    visit(info.tree.body, (), "")
    return out


def read_from(info: ModuleInfo, path: str) -> bool:
    """Whether the index read `info` from the snapshot file `path`: only then is what a per-file memo
    keeps for `path` (under that file's digest) about `info`."""
    return info.origin == "port" and info.path == path


def kept_import_sites(info: ModuleInfo, path: str, memo: FileMemo | None) -> list[ImportSite]:
    """import_sites of the snapshot file at `path`, kept per file in `memo` (a function of its bytes,
    its module name and whether it is a package)."""
    if memo is None or not read_from(info, path):
        return import_sites(info, path)
    return memo.get(path, ("import-sites", info.name, info.is_package), partial(import_sites, info, path))


@dataclass(frozen=True)
class BrokenImport:
    """One missing module or name, with every site that imports it and what fails with it."""

    answer: NameAnswer
    sites: tuple[ImportSite, ...]
    uses: tuple[tuple[str, int, str], ...]  # (path, line, text) of the uses that fail with it
    at_base: bool | None


@dataclass(frozen=True)
class _MissingAt:
    """One import site of a file whose root cause does not resolve: what a file's unit keeps."""

    site: ImportSite
    key: tuple[str, str | None]
    answer: NameAnswer
    at_base: bool | None
    uses: tuple[tuple[str, int, str], ...]


def broken_imports(discovery: Discovery, symbols: SymbolTable, memo: FileMemo | None = None,
                   units: TraceMemo | None = None) -> list[BrokenImport]:
    """Imports of port and upstream modules in scope that do not resolve, grouped by root cause.

    Each file's missing imports are a function of its sites and of what the lookups read: with
    `units` (a trace memo over the review's module index) a file is a unit kept with the port names
    its lookups read, served again while those look the same (upstream and base are in the memo's key)."""
    groups: dict[tuple[str, str | None], list[_MissingAt]] = {}
    scope = [sf.path for sf in discovery.files if sf.parse_error is None and sf.path.endswith(".py")]
    targets = frozenset(module_name(p) for p in scope)
    # A caller outside the scope (a model, a customized layer) is bound where it touches the attention
    # code: its imports of the modules in scope, reported under the caller.
    work = [(p, None) for p in scope] + [(p, targets) for p in caller_paths(discovery)]
    for path, only in work:
        compute = partial(_file_missing, path, symbols, memo, only)
        if units is None:
            missing = compute()[0]
        else:
            from metax_audit.core.memo import file_digest

            parts = ["imports", path, file_digest(discovery.root / path)]
            missing = units.unit(parts if only is None else [*parts, "caller", *sorted(only)], compute)[0]
        for m in missing:
            groups.setdefault(m.key, []).append(m)
    return [BrokenImport(ms[0].answer, tuple(m.site for m in ms), tuple(u for m in ms for u in m.uses), ms[0].at_base)
            for ms in groups.values()]


def caller_paths(discovery: Discovery) -> list[str]:
    """Port files outside the scope that import a module in scope (discover's callers), in path order."""
    scope = {sf.path for sf in discovery.files}
    return sorted({c for cs in discovery.callers.values() for c in cs if c.endswith(".py") and c not in scope
                   and (discovery.root / c).is_file()})


def _file_missing(path: str, symbols: SymbolTable, memo: FileMemo | None, only: frozenset[str] | None = None,
                  ) -> tuple[list[_MissingAt], UnitResult]:
    """The import sites of one file whose root cause a lookup does not find (a missing answer is
    always exact: it never takes the text shortcut), with the base's word and the uses that fail.
    `only`: the modules whose imports are bound (a caller outside the scope: the modules in scope)."""
    from metax_audit.stages.trace.memo import UnitResult

    info = symbols.index.module_for_path(path)
    out: list[_MissingAt] = []
    answers: dict[tuple[str, str | None], NameAnswer] = {}
    for site in (kept_import_sites(info, path, memo) if info is not None else ()):
        if only is not None and site.module not in only and (site.name is None or f"{site.module}.{site.name}" not in only):
            continue
        if symbols.provider(site.module) not in (Provider.PORT, Provider.UPSTREAM):
            continue  # kernel packages: MXA120 over introspection facts; others are not read
        key = _root_key(site, symbols)
        if key not in answers:
            answers[key] = symbols.lookup_import(*key)
        if answers[key].missing and not _compiled_extension(answers[key], symbols):
            assert info is not None
            out.append(_MissingAt(site, key, answers[key], symbols.at_base(*key), tuple(_uses(info, site))))
    return out, UnitResult(frozenset(), frozenset(), ())


def _root_key(site: ImportSite, symbols: SymbolTable) -> tuple[str, str | None]:
    """The first missing piece is the root cause: `from a.b import c` with a.b missing is module a.b."""
    if site.name is not None and not symbols.index.exists(site.module) and symbols.index.namespace_dir(site.module) is None:
        return (site.module, None)
    return (site.module, site.name)


def _compiled_extension(answer: NameAnswer, symbols: SymbolTable) -> bool:
    """A private port module without Python source (vllm_metax._C): a built extension the snapshot,
    which holds sources only, cannot contain. Not a broken import; the stack pins cover it."""
    last = answer.module.rsplit(".", 1)[-1] if answer.name is None else answer.name
    if answer.provider is not Provider.PORT or not last.startswith("_") or last.startswith("__"):
        return False
    if answer.status is Status.MISSING_MODULE:
        return True
    # `from vllm_ascend import _build_info`: a private submodule of a port package that setup.py writes
    # at build time (or a built extension); the name is missing from the package, not from its code.
    return answer.status is Status.MISSING_NAME and symbols.index.is_package(answer.module)


def _uses(info: ModuleInfo, site: ImportSite) -> list[tuple[str, int, str]]:
    """Runtime uses of the imported local name in the module (annotations excluded), in line order."""
    out = []
    lines = info.source.splitlines()
    for node in _runtime_loads(info):
        if node.id == site.local and node.lineno != site.line:
            text = lines[node.lineno - 1].strip() if node.lineno <= len(lines) else ""
            out.append((site.path, node.lineno, text))
    return sorted(set(out))


def _runtime_loads(info: ModuleInfo) -> list[ast.Name]:
    """Name loads outside annotations (and outside every annotation under postponed evaluation)."""
    cached = getattr(info.tree, "_mxa_runtime_loads", None)
    if cached is not None:
        return cached
    in_ann: set[int] = set()
    for node in walk_nodes(info.tree):
        anns: list[ast.expr | None] = []
        if isinstance(node, ast.arg):
            anns.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            anns.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            anns.append(node.annotation)
        for a in anns:
            if a is not None:
                in_ann.update(id(n) for n in ast_walk(a))
    loads = [n for n in walk_nodes(info.tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and id(n) not in in_ann]
    info.tree._mxa_runtime_loads = loads  # type: ignore[attr-defined]
    return loads


def _future_annotations(info: ModuleInfo) -> bool:
    return any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and any(a.name == "annotations" for a in n.names)
               for n in info.tree.body)


REMOVED_SINCE_BASE = "the base release defines it: removed or renamed upstream since the port's last sync"
FAILS_WITH = "fails with it: "  # evidence prefix of a use that breaks because of the finding's import
READ = "read: "  # evidence prefix of an attribute read that fails (MXA125/126)
_ROOT_CAUSES = frozenset({"MXA122", "MXA125", "MXA126", "MXA127"})


def absorb_consequences(findings: list[Finding]) -> list[Finding]:
    """One finding per root cause: an unresolved-call finding (MXA054) on a line that a broken import
    or attribute lists as failing with it is that root cause's consequence, not a second finding."""
    failing = {(x.path, x.line) for f in findings if f.rule in _ROOT_CAUSES for x in f.sites if x.kind in {"use", "read"}}
    return [f for f in findings if not (f.rule == "MXA054" and (f.location.path, f.location.line) in failing)]


def check_port_imports(discovery: Discovery, symbols: SymbolTable, memo: FileMemo | None = None,
                       units: TraceMemo | None = None) -> Iterator[Finding]:
    for broken in broken_imports(discovery, symbols, memo, units):
        yield _broken_finding(discovery.root, broken, symbols)


def _broken_finding(root: Path, b: BrokenImport, symbols: SymbolTable | None = None) -> Finding:
    a = b.answer
    first = b.sites[0]
    what = f"module {a.module}" if a.name is None else f"{a.name!r} from {a.module}"
    severity, why = _severity(b, symbols)
    ev = [f"port: {s.path}:{s.line}: {source_line(root, s.path, s.line)}" + (f"  (lazy, in {s.function})" if s.function else "")
          for s in b.sites[:8]]
    ev.append(f"{a.label}: {a.reason or 'not found'}")
    if a.near:
        ev.append("closest existing names: " + ", ".join(a.near))
    if b.at_base is True:
        ev.append(REMOVED_SINCE_BASE)
    elif b.at_base is False:
        ev.append("the base release does not define it either")
    ev += why
    for path, line, text in b.uses[:8]:
        ev.append(f"{FAILS_WITH}{path}:{line}: {text}")
    if len(b.uses) > 8:
        ev.append(f"... and {len(b.uses) - 8} more uses")
    more = f" (and {len(b.sites) - 1} more import site(s))" if len(b.sites) > 1 else ""
    sites = [Site(s.path, s.line, s.function, "import", source_line(root, s.path, s.line)) for s in b.sites]
    sites += [Site(path, line, "", "use", text) for path, line, text in b.uses]
    return make_finding("MXA122", Location(first.path, first.line, f"import:{a.module}:{a.name or ''}"),
                        f"imports {what}, which {a.label} does not define{more}", ev, severity=severity, sites=sites)


def _severity(b: BrokenImport, symbols: SymbolTable | None = None) -> tuple[Severity, list[str]]:
    """The least guarded site decides: one unguarded import breaks the module. A branch on one of the
    port's version tests (config version-tests) is decided for the upstream release under review: not
    taken, the import never runs with it (info); taken, the test guards nothing."""
    best: tuple[int, Severity, list[str]] | None = None
    tests = symbols.version_tests if symbols is not None else {}
    version = symbols.upstream_version if symbols is not None else None
    for s in b.sites:
        rank, sev, notes = 3, Severity.ERROR, ["unguarded: importing the module fails" if not s.function else f"fails when {s.function} runs"]
        decided = {g: branch_taken(g.text, tests, version) for g in s.guards if g.kind == "if"}
        dead = next((g for g, taken in decided.items() if taken is False), None)
        if dead is not None:
            assert symbols is not None
            rank, sev, notes = 0, Severity.INFO, [f"guarded: {dead.text} - not taken with {symbols.upstream_label} "
                                                  "(the port's version test): the import never runs with this release"]
        elif any(g.kind == "type-checking" for g in s.guards):
            runtime = [u for u in b.uses if u[0] == s.path]
            if runtime:
                rank, sev, notes = 3, Severity.ERROR, [f"imported under if TYPE_CHECKING but used at runtime ({runtime[0][0]}:{runtime[0][1]}): NameError"]
            else:
                rank, sev, notes = 1, Severity.INFO, ["guarded: if TYPE_CHECKING, used only in annotations (never imported at runtime)"]
        else:
            guards = [g for g in s.guards if not (g.kind == "try" and g.reraises) and decided.get(g) is not True]
            held = [g for g, taken in decided.items() if taken is True]
            if held and symbols is not None:
                notes = [*notes, f"{held[-1].text} holds with {symbols.upstream_label} (the port's version test): it guards nothing here"]
            if guards:
                # The port guards the import (try/except ImportError, an availability check): the guard says
                # the name may be absent and what runs then; info with the guard as evidence. Another condition
                # (a platform or a version test) breaks whenever it holds: a warning.
                g = guards[-1]
                rank, sev = 2, Severity.INFO if g.kind == "try" or _AVAILABILITY.search(g.text) else Severity.WARNING
                notes = [f"guarded: {g.text}" + (" - the fallback always runs on this stack" if g.kind == "try" else " - taken only when the condition holds")]
        if best is None or rank > best[0]:
            best = (rank, sev, notes)
    assert best is not None
    return best[1], best[2]


# ---------------------------------------------------------------- TYPE_CHECKING names at runtime

rule("MXA123", Category.IMPORT, Severity.ERROR, "a name imported only under if TYPE_CHECKING is evaluated at runtime",
     "The name exists only for the type checker (at runtime it is unbound, or bound to a placeholder such as None in "
     "the else branch), but code or an eagerly evaluated annotation (a def's parameters and return, a module or class "
     "variable annotation, without `from __future__ import annotations` and not a string) uses it: NameError, or "
     "TypeError for `None | None`, when the module is imported or the code runs. Quote the annotation or add the "
     "__future__ import.")


def check_type_checking_names(discovery: Discovery, symbols: SymbolTable, memo: FileMemo | None = None) -> Iterator[Finding]:
    """Each file's findings are a function of its bytes (kept per file in `memo`)."""
    for sf in discovery.files:
        if sf.parse_error is not None or not sf.path.endswith(".py"):
            continue
        info = symbols.index.module_for_path(sf.path)
        if info is None:
            continue
        if memo is None or not read_from(info, sf.path):
            yield from _type_checking_uses(info, sf.path)
        else:
            yield from memo.get(sf.path, ("type-checking-uses",), partial(_type_checking_list, info, sf.path))


def _type_checking_list(info: ModuleInfo, path: str) -> list[Finding]:
    return list(_type_checking_uses(info, path))


def _type_checking_uses(info: ModuleInfo, path: str) -> Iterator[Finding]:
    checking, placeholders, runtime = _checking_names(info.tree.body)
    only = {n: line for n, line in checking.items() if n not in runtime or n in placeholders}
    if not only:
        return
    eager = not _future_annotations(info)
    lines = info.source.splitlines()
    hits: dict[str, list[tuple[int, str]]] = {}
    for node, why in _runtime_positions(info.tree, eager):
        for n in ast_walk(node):
            if not (isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in only):
                continue
            if n.id in placeholders and not ("annotation" in why and _none_union(node, placeholders)):
                continue  # a placeholder (None) is a valid value; only `None | None` breaks
            hits.setdefault(n.id, []).append((n.lineno, why))
    for name, uses in hits.items():
        uses = sorted(set(uses))
        first = uses[0][0]
        placeholder = placeholders.get(name)
        cause = (f"at runtime {name} is the placeholder {placeholder} (else branch), so `|` of it raises TypeError"
                 if placeholder else f"at runtime {name} is unbound: NameError")
        ev = [f"import: {path}:{only[name]}: {_text(lines, only[name])}  (under if TYPE_CHECKING)",
              *(f"{FAILS_WITH}{path}:{line}: {_text(lines, line)}  ({why})" for line, why in uses[:8]), cause]
        if eager:
            ev.append("annotations are evaluated when the def or class body runs (no `from __future__ import annotations`)")
        yield make_finding("MXA123", Location(path, first, f"type-checking:{name}"),
                           f"{name} is imported only under if TYPE_CHECKING but evaluated at runtime ({len(uses)} use(s))", ev)


def _text(lines: list[str], n: int) -> str:
    return lines[n - 1].strip() if 0 < n <= len(lines) else ""


def _checking_names(body: list[ast.stmt]) -> tuple[dict[str, int], dict[str, str], set[str]]:
    """(names bound under a module-level if TYPE_CHECKING, placeholders the else branch gives them,
    names bound at runtime anywhere else at module level)."""
    checking: dict[str, int] = {}
    placeholders: dict[str, str] = {}
    runtime: set[str] = set()
    for st in body:
        if isinstance(st, ast.If) and _is_type_checking(st.test):
            for sub in st.body:
                for name in _bound_by(sub):
                    checking.setdefault(name, sub.lineno)
            for sub in st.orelse:
                if isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Constant) and sub.value.value is None:
                    for t in sub.targets:
                        if isinstance(t, ast.Name):
                            placeholders[t.id] = "None"
                runtime.update(_bound_by(sub))
        else:
            for node in ast_walk(st) if not isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) else [st]:
                runtime.update(_bound_by(node))  # type: ignore[arg-type]
    return checking, {k: v for k, v in placeholders.items() if k in checking}, runtime


def _bound_by(st: ast.AST) -> list[str]:
    if isinstance(st, ast.Import):
        return [a.asname or a.name.split(".")[0] for a in st.names]
    if isinstance(st, ast.ImportFrom):
        return [a.asname or a.name for a in st.names if a.name != "*"]
    if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [st.name]
    if isinstance(st, ast.Name) and isinstance(st.ctx, ast.Store):
        return [st.id]
    if isinstance(st, ast.Assign | ast.AnnAssign | ast.AugAssign):
        targets = st.targets if isinstance(st, ast.Assign) else [st.target]
        return [n.id for t in targets for n in ast_walk(t) if isinstance(n, ast.Name)]
    return []


def _runtime_positions(tree: ast.Module, eager: bool) -> Iterator[tuple[ast.expr, str]]:
    """Expressions evaluated at runtime in module scope terms: eager annotations, and code outside
    annotations (function bodies that rebind the name locally are the caller's blind spot: skipped
    here by leaving out functions that import or assign anything of the same name)."""
    def visit(stmts: list[ast.stmt], in_function: bool, local: set[str]) -> Iterator[tuple[ast.expr, str]]:
        for st in stmts:
            if isinstance(st, ast.If) and _is_type_checking(st.test):
                yield from visit(st.orelse, in_function, local)
                continue
            if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef):
                if eager:
                    for a in [*st.args.posonlyargs, *st.args.args, *st.args.kwonlyargs, st.args.vararg, st.args.kwarg]:
                        if a is not None and a.annotation is not None and not _is_str(a.annotation):
                            yield a.annotation, "annotation of a parameter, evaluated when the def runs"
                    if st.returns is not None and not _is_str(st.returns):
                        yield st.returns, "return annotation, evaluated when the def runs"
                yield from ((d, "decorator") for d in st.decorator_list)
                yield from ((d, "default value") for d in [*st.args.defaults, *(k for k in st.args.kw_defaults if k is not None)])
                inner = {n for s in st.body for node in ast_walk(s) for n in _bound_by(node)}
                inner |= {a.arg for a in ast_walk(st.args) if isinstance(a, ast.arg)}
                yield from visit(st.body, True, local | inner)
                continue
            if isinstance(st, ast.ClassDef):
                yield from ((b, "base class") for b in [*st.bases, *st.decorator_list])
                yield from visit(st.body, in_function, local)
                continue
            if isinstance(st, ast.AnnAssign):
                if eager and not in_function and not _is_str(st.annotation):
                    yield st.annotation, "annotation of a module or class variable, evaluated at import"
                if st.value is not None:
                    yield from _unless_local(st.value, local, "code")
                continue
            for field in ("body", "orelse", "finalbody"):
                sub = getattr(st, field, None)
                if isinstance(sub, list):
                    yield from visit(sub, in_function, local)
            for h in getattr(st, "handlers", []) or []:
                yield from visit(h.body, in_function, local)
            for child in ast_children(st):
                if isinstance(child, ast.expr):
                    yield from _unless_local(child, local, "code")
    yield from visit(tree.body, False, set())


def _unless_local(expr: ast.expr, local: set[str], why: str) -> Iterator[tuple[ast.expr, str]]:
    if not local or not any(isinstance(n, ast.Name) and n.id in local for n in ast_walk(expr)):
        yield expr, why
    elif isinstance(expr, ast.Name):
        return
    else:
        for child in ast_children(expr):
            if isinstance(child, ast.expr):
                yield from _unless_local(child, local, why)


def _is_str(e: ast.expr) -> bool:
    return isinstance(e, ast.Constant) and isinstance(e.value, str)


def _none_union(ann: ast.expr, placeholders: dict[str, str]) -> bool:
    """`X | None` (or `X | Y`) whose operands are all None at runtime: TypeError."""
    for n in ast_walk(ann):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitOr):
            sides = [n.left, n.right]
            if all((isinstance(s, ast.Constant) and s.value is None) or (isinstance(s, ast.Name) and s.id in placeholders) for s in sides):
                return True
    return False
