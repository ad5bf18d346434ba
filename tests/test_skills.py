# The skills/ guides name exact CLI commands; this checks that every `metax-audit <cmd> --option`
# they mention exists, by asking the CLI itself (`<cmd> --help` through typer's CliRunner).
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GUIDES = sorted((REPO / "skills").glob("*/SKILL.md"))
_CMD = re.compile(r"metax-audit\s+([a-z][a-z-]*)((?:[ \t]+[^\s`|]+)*)")


def _code(text: str) -> list[str]:
    """Command text lives in fenced blocks and inline code spans; prose mentions are not commands."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    rest = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    inline = re.findall(r"`([^`\n]+)`", rest.replace("\n  ", " "))
    return [*fenced, *inline]


def _mentions() -> list[tuple[str, str, tuple[str, ...]]]:
    out = []
    for guide in GUIDES:
        for m in (m for chunk in _code(guide.read_text(encoding="utf-8")) for m in _CMD.finditer(chunk)):
            opts = tuple(sorted({t.split("=")[0] for t in m.group(2).split() if t.startswith("--")}))
            out.append((guide.parent.name, m.group(1), opts))
    return out


def _app():
    from metax_audit import cli  # a CLI that does not import is a failure, never a skip

    return cli.app


def test_guides_exist_and_name_commands():
    assert {g.parent.name for g in GUIDES} >= {"attention-upgrade", "upgrade-common"}
    mentions = _mentions()
    cmds = {c for _, c, _ in mentions}
    assert {"review", "trace", "probe", "evidence", "contracts"} <= cmds
    assert sum(len(o) for _, _, o in mentions) >= 20  # the guides name options, not just commands


def test_extraction_sees_options():
    text = "metax-audit snapshots the index; run `metax-audit review --rev HEAD --format=md,json`\n```\nmetax-audit trace all\n```\n"
    found = [(m.group(1), m.group(2)) for chunk in _code(text) for m in _CMD.finditer(chunk)]
    assert [c for c, _ in found] == ["trace", "review"]
    assert "--format=md,json" in found[1][1]


@pytest.mark.parametrize(("guide", "command", "options"), _mentions(), ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_every_named_command_and_option_exists(guide, command, options):
    app = _app()
    import typer
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, f"{guide}: `metax-audit {command}` is not a command: {result.output[-400:]}"
    click_cmd = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    known = {o for p in click_cmd.params for o in (*p.opts, *p.secondary_opts)}
    missing = [o for o in options if o not in known]
    assert not missing, f"{guide}: `metax-audit {command}` has no option {missing} (has {sorted(known)})"
