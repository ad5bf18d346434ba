# docs/rules.md is generated from the rule table; it must match the code, and every declared
# rule must appear in it with its category, severity and help.
from __future__ import annotations

from pathlib import Path

from metax_audit.core.findings import RULES
from metax_audit.report import rules_doc

DOC = Path(__file__).resolve().parents[1] / "docs" / "rules.md"


def test_docs_rules_md_is_up_to_date():
    text = rules_doc.render_rules_markdown()
    assert DOC.is_file(), f"docs/rules.md is missing: run `{rules_doc.REGENERATE}`"
    assert DOC.read_text(encoding="utf-8") == text, f"docs/rules.md is stale: run `{rules_doc.REGENERATE}`"


def test_every_rule_is_documented():
    text = rules_doc.render_rules_markdown()
    assert RULES, "no rules loaded"
    for rule in RULES.values():
        assert f"\n### {rule.id}\n" in text
        assert f"| [{rule.id}](#{rule.id.lower()}) | {rule.category.value} | {rule.severity.value} | {rule.title} |" in text
    assert "MXA300" in RULES  # the inactive-path check's rule is found by the module walk


def test_missing_rule_module_is_skipped(monkeypatch):
    monkeypatch.setattr(rules_doc, "RULE_MODULES", (*rules_doc.RULE_MODULES, "metax_audit.not_written_yet"))
    assert "MXA001" in rules_doc.load_all_rules()


def test_excluded_modules_are_not_imported():
    assert rules_doc._excluded("metax_audit.cli")
    assert rules_doc._excluded("metax_audit.demo.data.port")
    assert not rules_doc._excluded("metax_audit.stages.checks.stack")


def test_every_rule_says_what_makes_each_severity_with_an_example():
    from metax_audit.report.severity_doc import SEVERITY

    text = rules_doc.render_rules_markdown()
    for rule in rules_doc.load_all_rules().values():
        entries = SEVERITY.get(rule.id, ())
        assert rule.severity.value in {sev for sev, _, _ in entries}, (
            f"{rule.id}: add what makes it {rule.severity.value} (and an example) to metax_audit/report/severity_doc.py")
        for sev, when, example in entries:
            assert sev in {"error", "warning", "info"} and when and example
            assert f"- **{sev}** when {when}. Example: {example}." in text
