# Rule `import`: a name the port imports from an external kernel package that the installed (or
# manifest) package does not provide, private names included. Reads the port's ast from the snapshot.
from __future__ import annotations

from collections.abc import Iterator

from metax_audit.checks.stack import build_note, source_line
from metax_audit.findings import make_finding, rule
from metax_audit.models import Category, Discovery, Finding, Location, Severity, StackFacts
from metax_audit.pysource import ImportedName, imported_names

rule("MXA120", Category.IMPORT, Severity.ERROR, "port imports a name the installed kernel package does not provide",
     "Importing the module fails with ImportError (or AttributeError on use) against the installed package. "
     "Private names (leading underscore) move between releases without notice: vendor the helper or pin the kernel.")
rule("MXA121", Category.IMPORT, Severity.INFO, "imported name could not be checked against the installed kernel package",
     "Introspection could not import or read the package; this is not evidence the name is missing.")


def check_imports(discovery: Discovery, facts: StackFacts) -> Iterator[Finding]:
    """Check every port import whose target introspection has a fact for (see imported_names)."""
    tops = {t.split(".")[0] for t in facts.facts}
    paths = [f.path for f in discovery.files if f.parse_error is None]
    unchecked: dict[str, list[ImportedName]] = {}
    for imp in imported_names(discovery.root, paths, sorted(tops)):
        fact = facts.facts.get(imp.target)
        if fact is None:
            continue
        loc = Location(imp.path, imp.line, f"import:{imp.target}")
        port_side = f"port: {imp.path}:{imp.line}: {source_line(discovery.root, imp.path, imp.line)}"
        if fact.status == "not-found":
            severity = None
            notes = [f"lookup: {fact.error}" if fact.error else "lookup failed", *build_note(fact)]
            if fact.source == "static":
                severity = Severity.WARNING  # a dynamic export is invisible to a static read
                notes.append("read statically from source; a runtime-only export would not be seen")
            if imp.guarded:
                severity = Severity.WARNING
                notes.append("the import sits in a try/except: check the fallback path is what runs")
            dist = " ".join(x for x in (fact.distribution, fact.version) if x)
            what = f"{imp.name!r} from {imp.module}" if imp.name else f"module {imp.module}"
            yield make_finding("MXA120", loc, f"imports {what}, which installed {dist or imp.module.split('.')[0]} does not provide",
                               [port_side, f"installed: {imp.target} missing  [{fact.source}{' via ' + facts.source if facts.source.startswith('manifest:') else ''}{', ' + dist if dist else ''}]", *notes],
                               severity=severity)
        elif fact.status != "ok":
            unchecked.setdefault(imp.module.split(".")[0], []).append(imp)
    for top, imps in unchecked.items():
        first = imps[0]
        fact = facts.facts[first.target]
        yield make_finding("MXA121", Location(first.path, first.line, f"import:{top}:not-checked"),
                           f"{len(imps)} import(s) from {top} not checked: introspection says {fact.status}",
                           [f"fact: {fact.target} status={fact.status}: {fact.error or ''}",
                            *(f"port: {i.path}:{i.line}: import {i.target}" for i in imps[:10])])
