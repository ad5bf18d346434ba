# The rules reference (docs/rules.md), generated from metax_audit.core.findings.RULES so the docs
# cannot drift from the code: `python -m metax_audit.report.rules_doc > docs/rules.md`.
from __future__ import annotations

import importlib
import pkgutil
import sys
from dataclasses import dataclass

import metax_audit
from metax_audit.core.findings import RULES, Rule
from metax_audit.core.models import Category
from metax_audit.report.severity_doc import SEVERITY

REGENERATE = "python -m metax_audit.report.rules_doc > docs/rules.md"

# Modules known to declare rules; a name that does not exist yet is skipped (stages land one
# by one), while a module that exists but fails to import is an error worth seeing.
RULE_MODULES = (
    "metax_audit.core.findings",
    "metax_audit.stages.discover",
    "metax_audit.stages.trace",
    "metax_audit.stages.introspect",
    "metax_audit.stages.compare",
    "metax_audit.stages.checks",
    "metax_audit.pipeline.waivers",
    "metax_audit.stages.probing",
    "metax_audit.core.contracts",
    "metax_audit.stages.inventory",
)
# Entry points and data, not rule declarers: importing them runs a CLI, starts a worker or
# pulls the demo data tree.
EXCLUDED = frozenset({"cli", "__main__", "demo", "introspect_worker"})


def _excluded(name: str) -> bool:
    return any(part in EXCLUDED for part in name.split(".")[1:])


def _import_optional(name: str) -> None:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
            raise  # the module exists but one of its own imports is missing


def _walk(path: list[str], prefix: str) -> None:
    # pkgutil.walk_packages would import every package to descend into it, the excluded ones
    # (demo) too; iter_modules plus our own descent imports only what is not excluded.
    for info in sorted(pkgutil.iter_modules(path, prefix), key=lambda i: i.name):
        if _excluded(info.name):
            continue
        _import_optional(info.name)
        if info.ispkg:
            _walk(list(getattr(sys.modules[info.name], "__path__", [])), info.name + ".")


def load_all_rules() -> dict[str, Rule]:
    """Import every module that may declare rules, then return the registry sorted by id."""
    for name in RULE_MODULES:
        _import_optional(name)
    _walk(metax_audit.__path__, "metax_audit.")
    return {k: RULES[k] for k in sorted(RULES)}


def rule_of(rule_id: str) -> Rule | None:
    """The rule `rule_id`, declared or not yet: a review served whole from the cache imports none of
    the stages that declare their rules, so their titles (the first screen's "what breaks", SARIF's
    rule descriptions) would be missing from a second run's reports; the stages are imported then."""
    if rule_id not in RULES:
        for name in RULE_MODULES:
            _import_optional(name)
        if rule_id not in RULES:
            load_all_rules()
    return RULES.get(rule_id)


@dataclass(frozen=True)
class RuleExplanation:
    """What `metax-audit rule ID` says: the rule, what makes it each severity (with an example), and a
    waiver entry for it; the same table docs/rules.md is generated from."""

    rule: Rule
    severities: tuple[tuple[str, str, str], ...]  # (severity, when, example)
    waiver: tuple[str, ...]  # the lines of a waivers-file entry for it
    doc: str  # where docs/rules.md explains it


def explain(rule_id: str) -> RuleExplanation | None:
    """The explanation of `rule_id` (case-insensitive), or None for a rule that does not exist."""
    found = rule_of(rule_id.strip().upper())
    if found is None:
        return None
    waiver = ("- rule: " + found.id, "  path: vllm_metax/v1/attention/backends/flashinfer.py  # a glob",
              "  reason: why this finding is accepted (who decided, what proves it harmless)",
              "  expires: 2027-06-30  # optional: after this date the waiver is itself a finding")
    return RuleExplanation(found, tuple(SEVERITY.get(found.id, ())), waiver, f"docs/rules.md#{_anchor(found)}")


def _anchor(r: Rule) -> str:
    return r.id.lower()


def render_rules_markdown() -> str:
    rules = load_all_rules()
    out = [
        "# metax-audit rules",
        "",
        f"Generated from the code by `{REGENERATE}`; do not edit by hand. On a terminal, "
        "`metax-audit rule MXA101` prints one rule's entry (with a waiver for it) and `metax-audit rules` the table.",
        "",
        "Every finding carries one of these rule ids, a category from the fixed vocabulary, a severity "
        "(the default below; `severity_overrides` in `[tool.metax-audit]` can change it per rule) and "
        "its evidence. To accept a finding on purpose, waive it in the waivers file with the rule id, "
        "the path and the reason; a waiver that matches nothing is reported as stale.",
        "",
        "Severity means consequence: **error** = it breaks on the target stack (a call that does not bind, a "
        "semantic mismatch proven by dataflow or a probe); **warning** = it can change what a kernel computes or "
        "whether it runs on the vendor device, and nothing in the evidence explains it; **info** = true but explained "
        "(a known vendor adaptation, with the reason) or harmless (a path the vendor never runs, with the gate). "
        "Each rule below says what makes it each severity it can have, with an example.",
        "",
        f"{len(rules)} rules.",
        "",
        "| rule | category | severity | meaning |",
        "|---|---|---|---|",
    ]
    out += [f"| [{r.id}](#{_anchor(r)}) | {r.category.value} | {r.severity.value} | {r.title} |" for r in rules.values()]
    out.append("")
    for cat in Category:
        group = [r for r in rules.values() if r.category is cat]
        if not group:
            continue
        out += [f"## {cat.value}", ""]
        for r in group:
            out += [f"### {r.id}", "", f"**{r.title}** — default severity `{r.severity.value}`.", "", " ".join(r.help.split()), ""]
            out += [f"- **{sev}** when {when}. Example: {example}." for sev, when, example in SEVERITY.get(r.id, ())]
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def main() -> None:
    sys.stdout.write(render_rules_markdown())


if __name__ == "__main__":
    main()
