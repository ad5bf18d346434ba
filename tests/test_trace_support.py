# Builders for the trace tests: a tiny port package (and optional upstream tree) written from
# strings into tmp_path, and a hand-made Discovery that registers its backends.
from __future__ import annotations

import textwrap
from pathlib import Path

from conftest import write_tree

from metax_audit.core.config import AuditConfig
from metax_audit.core.models import CallSite, Discovery, Location, PriorityList, Registration, SourceFile, TraceResult
from metax_audit.stages.trace import trace_backends

PORT = "mxport"
CONFIG = AuditConfig(port_package=PORT)

# A backend skeleton: the tests put the code under test into the impl's forward (or helpers).
BACKEND = '''
from vllm.v1.attention.backend import AttentionBackend, AttentionImpl


class DemoBackend(AttentionBackend):
    @staticmethod
    def get_impl_cls():
        return DemoImpl

    @staticmethod
    def get_builder_cls():
        return DemoBuilder


class DemoBuilder:
    def build(self, common_prefix_len, common_attn_metadata):
        return None


class DemoImpl(AttentionImpl):
    def __init__(self, num_heads):
        self.num_heads = num_heads

{body}
'''


def port_files(extra: dict[str, str] | None = None, body: str = "") -> dict[str, str]:
    files = {
        f"{PORT}/__init__.py": "",
        f"{PORT}/v1/__init__.py": "",
        f"{PORT}/v1/attention/__init__.py": "",
        f"{PORT}/v1/attention/backends/__init__.py": "",
        f"{PORT}/v1/attention/backends/demo.py": BACKEND.replace("{body}", textwrap.indent(textwrap.dedent(body), "    ")),
    }
    files.update(extra or {})
    return files


def discovery(root: Path, regs: list[tuple[str, str]] | None = None, active: tuple[str, ...] = ("DEMO",), kind: str = "attention-backend") -> Discovery:
    regs = regs or [("DEMO", f"{PORT}.v1.attention.backends.demo.DemoBackend")]
    registrations = tuple(
        Registration(kind, name, path, Location(f"{PORT}/platform.py", 10 + i), True) for i, (name, path) in enumerate(regs)
    )
    files = tuple(SourceFile(p.relative_to(root).as_posix(), "", "glob") for p in sorted(root.rglob("*.py")) if p.parts[len(root.parts)] == PORT and "attention" in p.parts)
    prio = (PriorityList("else", active, Location(f"{PORT}/platform.py", 5)),)
    return Discovery(root, PORT, files, registrations, prio, (), {})


def run_trace(tmp_path: Path, body: str = "", extra: dict[str, str] | None = None, upstream: dict[str, str] | None = None, **kw) -> TraceResult:
    root = tmp_path / "port"
    write_tree(root, port_files(extra, body))
    up = None
    if upstream is not None:
        up = tmp_path / "upstream"
        write_tree(up, upstream)
    return trace_backends(discovery(root, **kw), CONFIG, up)


def calls_to(result: TraceResult, callee_text: str) -> list[CallSite]:
    return [c for ch in result.backends for c in ch.calls if c.callee_text == callee_text]


def one_call(result: TraceResult, callee_text: str) -> CallSite:
    found = {(c.location, c.resolved): c for c in calls_to(result, callee_text)}
    assert len(found) == 1, f"expected one call of {callee_text}, got {list(found)}"
    return next(iter(found.values()))


def unresolved_texts(result: TraceResult) -> dict[str, str]:
    return {u.text: u.reason for ch in result.backends for u in ch.unresolved}
