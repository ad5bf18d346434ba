# Report renderers, one module per format, all drawn from the same AuditReport; this module
# only chooses which to write and where (deterministic output, so golden files can pin it).
from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import ModuleType

from metax_audit.core.errors import ReportError
from metax_audit.core.models import AuditReport

FORMATS = ("md", "json", "sarif", "junit")  # written into --output-dir
# printed on stdout by the CLI after the review: github (report/github.py), text (report/lines.py:
# one line per finding, instead of the terminal summary)
STREAM_FORMATS = ("github", "text")
ALL_FORMATS = (*FORMATS, *STREAM_FORMATS)  # the one list --format is checked against


def parse_formats(text: str | Sequence[str]) -> tuple[str, ...]:
    """`md,json` -> ("md", "json"); unknown names are a ReportError naming the known ones."""
    items = text.split(",") if isinstance(text, str) else list(text)
    formats = tuple(dict.fromkeys(i.strip().lower() for i in items if i.strip()))
    unknown = [f for f in formats if f not in ALL_FORMATS]
    if unknown:
        raise ReportError(f"unknown report format(s) {', '.join(unknown)}; choose from {','.join(ALL_FORMATS)}")
    return formats


def write_reports(report: AuditReport, output_dir: Path, formats: Sequence[str]) -> list[Path]:
    """Write the chosen formats into `output_dir` and return the files written, sorted.

    Everything is rendered into a fresh private directory inside `output_dir` and then renamed into
    place, file by file: a reader never sees a half-written report, and a symlink already in the
    output directory (`summary.md -> ../victim`, `files -> /elsewhere`) is replaced, never
    written through."""
    return write_reports_timed(report, output_dir, formats, None)[1]


def write_reports_timed(report: AuditReport, output_dir: Path, formats: Sequence[str],
                        started: float | None) -> tuple[AuditReport, list[Path]]:
    """write_reports; with `started` (a time.perf_counter() value: the process's start), the reports
    state the real wall time, from `started` to the last report rendered: everything is rendered
    first, report.json up to its wall time, then the time is taken and summary.md rendered last.
    Returns the report as stated (its wall time) and the files written."""
    from metax_audit.core import tempdirs
    from metax_audit.report import json_report, junit, markdown, sarif

    chosen = parse_formats(formats)
    output_dir = Path(output_dir)
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        tempdirs.reclaim(output_dir)  # staging left by a killed run
        with tempdirs.scratch("report", parent=output_dir) as stage:
            staged: list[str] = []
            if "md" in chosen:
                staged += _write_pages(report, stage, output_dir, markdown)
            if "sarif" in chosen:
                staged.append(sarif.write_sarif(report, stage / "report.sarif").name)
            if "junit" in chosen:
                staged.append(junit.write_junit(report, stage / "report.junit.xml").name)
            fill_wall = json_report.dumps_until_wall(report) if "json" in chosen else None
            if started is not None:
                report = replace(report, wall_seconds=round(time.perf_counter() - started, 2))
            if fill_wall is not None:
                (stage / "report.json").write_text(fill_wall(report.wall_seconds), encoding="utf-8")
                staged.append("report.json")
            if "md" in chosen:
                (stage / "summary.md").write_text(
                    markdown.render_summary(report, markdown.source_linker(report, output_dir)), encoding="utf-8")
                staged.insert(0, "summary.md")
            written = _move_into_place(stage, output_dir, staged, markdown.FILES_DIR if "md" in chosen else None)
    except OSError as exc:
        raise ReportError(f"could not write reports into {output_dir}: {exc}; choose another --output-dir") from exc
    return report, sorted(written)


def _write_pages(report: AuditReport, stage: Path, final: Path, markdown: ModuleType) -> list[str]:
    """The per-file pages into `stage`, linked as they will be from `final`; staged names."""
    pages = stage / markdown.FILES_DIR
    pages.mkdir()
    names = []
    page_link = markdown.source_linker(report, final / markdown.FILES_DIR)
    chosen = markdown.page_names([rec.path for rec in report.files])
    for rec in report.files:
        name = chosen[rec.path]
        (pages / name).write_text(markdown.render_file_page(report, rec, page_link), encoding="utf-8")
        names.append(f"{markdown.FILES_DIR}/{name}")
    return names


# What each of our files starts with (or, for report.json, holds): a file of that name in the output
# directory that does not is someone else's, and is never replaced or removed.
_OURS = {
    "summary.md": lambda head: head.startswith(b"# metax-audit"),
    "report.json": lambda head: b'"schema": "metax-audit/report/' in head,
    "report.sarif": lambda head: b"metax-audit" in head[:8192] and b"sarif" in head[:8192],
    "report.junit.xml": lambda head: b'<testsuites name="metax-audit"' in head[:4096],
}


def _ours(path: Path, name: str) -> bool:
    """Whether the regular file at `path` is a report of ours named `name` (a page: files/*.md)."""
    from metax_audit.core import inputs

    try:
        data = inputs.read_bytes(path, follow_symlinks=False)
    except OSError:
        return False
    check = _OURS.get(name)
    if check is not None:
        return check(data)
    return data.startswith(b"# ") and b"[back to summary](" in data[:4096]


def _refuse_foreign(final: Path, staged: list[str]) -> None:
    """A ReportError when a file we would replace is a regular file that is not ours: an output
    directory that holds other files keeps them (a symlink is replaced, never followed)."""
    for name in staged:
        target = final / name
        try:
            st = os.lstat(target)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
            continue  # a link is replaced, never followed; a directory makes the rename fail
        if not _ours(target, name.rsplit("/", 1)[-1] if "/" not in name else "page"):
            raise OSError(f"{target} exists and was not written by metax-audit; it is left alone")


def _move_into_place(stage: Path, final: Path, staged: list[str], pages_dir: str | None) -> list[Path]:
    """Rename each staged file over its place in `final` (rename replaces a symlink, never follows
    it); our stale pages (files/*.md of files no longer in scope, recognised by their content) are
    removed, nothing else; a file of ours by name that is not ours by content stops the move."""
    _refuse_foreign(final, staged)
    if pages_dir is not None:
        pages = final / pages_dir
        if os.path.islink(pages):
            os.unlink(pages)  # the link itself; whatever it points at is left alone
        elif os.path.lexists(pages) and not pages.is_dir():
            raise OSError(f"{pages} exists and is not a directory of ours; it is left alone")
        pages.mkdir(exist_ok=True)
        wanted = {name.split("/", 1)[1] for name in staged if name.startswith(pages_dir + "/")}
        with os.scandir(pages) as entries:
            for entry in entries:
                if (entry.name.endswith(".md") and entry.name not in wanted and entry.is_file(follow_symlinks=False)
                        and _ours(Path(entry.path), "page")):
                    os.unlink(entry.path)
    written = []
    for name in staged:
        os.replace(stage / name, final / name)
        written.append(final / name)
    return written


def replace_file(path: Path, text: str) -> Path:
    """Write `text` to `path` through a temporary file renamed over it: atomic, and a symlink at
    `path` is replaced rather than followed."""
    import tempfile

    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path
