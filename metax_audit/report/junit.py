# JUnit XML for CI test tabs: one test case per file record and per probe. A file needing action
# fails, a file not analysed and a probe that could not run are skipped with the reason, never passes.
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from metax_audit.core.models import AuditReport, FileRecord, Finding, ProbeResult
from metax_audit.report.text import visible
from metax_audit.stages.inventory import NEEDS_ACTION, NOT_ANALYSED, probe_id

MAX_TEXT_CHARS = 20000
# XML 1.0 cannot hold most control characters; tracebacks and kernel logs sometimes carry them.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def to_junit_xml(report: AuditReport) -> str:
    by_id = {f.id: f for f in report.findings}
    suites = ET.Element("testsuites", name="metax-audit")
    files = _suite(suites, "metax-audit.files")
    for rec in report.files:
        _file_case(files, rec, by_id)
    probes = _suite(suites, "metax-audit.probes")
    for p in report.probes:
        _probe_case(probes, p)
    from metax_audit.stages.inventory import unchecked_extensions, unchecked_headline

    extensions = unchecked_extensions(report.findings)
    if report.unbound or extensions:  # each package accepted unbound, each keyword only a vendor build may take:
        stack = _suite(suites, "metax-audit.stack")  # a skipped case whose message is the headline
        skipped = [(f"bind {u.pin}", f"{u.calls} calls into {u.module} unchecked: {u.why} (accepted by {u.accepted_by})")
                   for u in report.unbound]
        skipped += [(f"bind {kw}= into {pkg}", f"{n} calls pass {kw}=, which the public base of {pkg} lacks and the vendor "
                     "build may take (vendor-extends): unchecked") for (pkg, kw), n in sorted(extensions.items())]
        for name, text in skipped:
            case = ET.SubElement(stack, "testcase", classname="metax-audit.stack", name=name)
            ET.SubElement(case, "skipped", message=unchecked_headline(report)).text = text
            _count(stack, "tests")
            _count(stack, "skipped")
    for attr in ("tests", "failures", "errors", "skipped"):
        suites.set(attr, str(sum(int(s.get(attr, "0")) for s in suites)))
    for el in suites.iter():  # every string from the repo: names, messages, evidence
        for key, value in el.attrib.items():
            el.set(key, visible(value))
        if el.text:
            el.text = visible(el.text, lines=True)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def write_junit(report: AuditReport, path: Path) -> Path:
    path.write_text(to_junit_xml(report), encoding="utf-8")
    return path


def _suite(parent: ET.Element, name: str) -> ET.Element:
    suite = ET.SubElement(parent, "testsuite", name=name)
    for attr in ("tests", "failures", "errors", "skipped"):
        suite.set(attr, "0")
    return suite


def _count(suite: ET.Element, attr: str) -> None:
    suite.set(attr, str(int(suite.get(attr, "0")) + 1))


def _clip(text: str) -> str:
    text = _NOT_XML.sub(lambda m: visible(m.group()), text)
    return text if len(text) <= MAX_TEXT_CHARS else text[:MAX_TEXT_CHARS] + "\n... (truncated; see report.json)"


def _finding_text(f: Finding) -> str:
    lines = [f"{f.severity.value} {f.rule} {f.location}: {f.message}"]
    lines += [f"    {e}" for e in f.evidence]
    if f.waived:
        lines.append(f"    waived: {f.waiver_reason or ''}")
    return "\n".join(lines)


def _file_case(suite: ET.Element, rec: FileRecord, by_id: dict[str, Finding]) -> None:
    case = ET.SubElement(suite, "testcase", classname="metax-audit.files", name=rec.path, file=rec.path)
    _count(suite, "tests")
    here = [by_id[i] for i in rec.findings if i in by_id]
    if rec.status == NEEDS_ACTION:
        _count(suite, "failures")
        node = ET.SubElement(case, "failure", message=_clip(rec.status_reason or "needs action"), type=NEEDS_ACTION)
        node.text = _clip("\n".join(_finding_text(f) for f in here))
    elif rec.status == NOT_ANALYSED:
        _count(suite, "skipped")
        ET.SubElement(case, "skipped", message=_clip(rec.status_reason or "not analysed"))
    elif here:
        out = ET.SubElement(case, "system-out")
        out.text = _clip("\n".join(_finding_text(f) for f in here))


def _probe_case(suite: ET.Element, p: ProbeResult) -> None:
    case = ET.SubElement(suite, "testcase", classname=f"metax-audit.probes.{p.family}", name=probe_id(p))
    _count(suite, "tests")
    facts = [f"verdict: {p.verdict}", f"matched: {p.matched}", f"expected: {p.expected}", f"device: {p.device}"]
    facts += [f"hypothesis {k}: worst abs error {v}" for k, v in sorted(p.hypotheses.items())]
    text = "\n".join(facts)
    if p.verdict in ("skipped", "not-checkable"):
        _count(suite, "skipped")
        ET.SubElement(case, "skipped", message=_clip(p.skipped_reason or p.verdict))
    elif p.verdict == "error":
        _count(suite, "errors")
        node = ET.SubElement(case, "error", message=_clip(p.skipped_reason or "probe raised"), type="error")
        node.text = _clip(text)
    elif p.verdict == "mismatch" or (p.expected is not None and p.matched != p.expected):
        _count(suite, "failures")
        want = p.expected or "a known hypothesis"
        node = ET.SubElement(case, "failure", message=f"matched {p.matched or 'no hypothesis'}, expected {want}", type=p.verdict)
        node.text = _clip(text)
    else:
        out = ET.SubElement(case, "system-out")
        out.text = _clip(text)
