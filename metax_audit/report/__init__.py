# Report renderers, one module per format, all drawn from the same AuditReport; this module
# only chooses which to write and where (deterministic output, so golden files can pin it).
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from metax_audit.errors import ReportError
from metax_audit.models import AuditReport

FORMATS = ("md", "json", "sarif", "junit")


def parse_formats(text: str | Sequence[str]) -> tuple[str, ...]:
    """`md,json` -> ("md", "json"); unknown names are a ReportError naming the known ones."""
    items = text.split(",") if isinstance(text, str) else list(text)
    formats = tuple(dict.fromkeys(i.strip().lower() for i in items if i.strip()))
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ReportError(f"unknown report format(s) {', '.join(unknown)}; choose from {','.join(FORMATS)}")
    return formats


def write_reports(report: AuditReport, output_dir: Path, formats: Sequence[str]) -> list[Path]:
    """Write the chosen formats into `output_dir` and return the files written, sorted."""
    from metax_audit.report import json_report, junit, markdown, sarif

    chosen = parse_formats(formats)
    output_dir = Path(output_dir)
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        if "md" in chosen:
            written += _write_markdown(report, output_dir, markdown)
        if "json" in chosen:
            written.append(json_report.write_json(report, output_dir / "report.json"))
        if "sarif" in chosen:
            written.append(sarif.write_sarif(report, output_dir / "report.sarif"))
        if "junit" in chosen:
            written.append(junit.write_junit(report, output_dir / "report.junit.xml"))
    except OSError as exc:
        raise ReportError(f"could not write reports into {output_dir}: {exc}; choose another --output-dir") from exc
    return sorted(written)


def _write_markdown(report: AuditReport, output_dir: Path, markdown: ModuleType) -> list[Path]:
    pages = output_dir / markdown.FILES_DIR
    pages.mkdir(exist_ok=True)
    wanted = {markdown.page_name(rec.path) for rec in report.files}
    # A page left from an earlier run would describe a file no longer in scope: remove our own
    # stale pages (only *.md in files/), nothing else in the directory.
    for old in pages.glob("*.md"):
        if old.name not in wanted:
            old.unlink()
    summary = output_dir / "summary.md"
    summary.write_text(markdown.render_summary(report, markdown.source_linker(report, output_dir)), encoding="utf-8")
    written = [summary]
    page_link = markdown.source_linker(report, pages)
    for rec in report.files:
        path = pages / markdown.page_name(rec.path)
        path.write_text(markdown.render_file_page(report, rec, page_link), encoding="utf-8")
        written.append(path)
    return written
