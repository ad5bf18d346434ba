# Rule `inactive-path`: code the port keeps (a vendor difference or a traced call) behind a feature
# that the platform's config switch turns off on every run, so it never runs there and nothing validates it.
from __future__ import annotations

import functools
import re
from collections.abc import Iterator

from metax_audit.core.findings import make_finding, rule
from metax_audit.core.models import (
    Category,
    Comparison,
    ConfigSwitch,
    Difference,
    Discovery,
    Finding,
    Location,
    Severity,
    TraceResult,
)
from metax_audit.stages.checks.stack import calls_by_path

INACTIVE_PATH = rule(
    "MXA300",
    Category.INACTIVE_PATH,
    Severity.INFO,
    "adaptation sits behind a feature the platform turns off",
    "The file keeps code (a vendor difference or a traced call) in a branch of a feature that the "
    "platform's config switch turns off on every run, so that code never runs on this platform and "
    "no probe or test exercises it. That is not a defect by itself: keeping upstream's branch makes "
    "the next sync easier, so do not delete it just to silence this. Know that it is unvalidated: "
    "before the switch is turned back on, probe the kernels the branch calls on the vendor device, and "
    "give undeclared differences inside it their reason. Waive with the reason (for example 'cascade "
    "is disabled on this platform until the vendor wrapper supports it') to acknowledge it.",
)

_OFF_VALUES = frozenset({"false", "0", "none", "off", "disabled", "no", "never"})
_ON_VALUES = frozenset({"true", "1", "on", "yes", "always"})
# Words around a switch's name that say how it works, not which feature it names:
# disable_cascade_attn -> ("cascade",), use_mm_prefix_lm -> ("mm", "prefix", "lm").
_LEAD_WORDS = frozenset({"disable", "disabled", "enable", "enabled", "use", "allow", "force", "support", "supports", "is", "no", "skip"})
_TAIL_WORDS = frozenset({"attn", "attention", "mode", "enabled", "flag", "level"})
# A condition made only of None guards is as good as unconditional.
_NONE_GUARD = re.compile(r"^\(?\s*[\w.]+ is not None\s*\)?$")


def _tokens(text: str) -> list[str]:
    """snake_case, dotted and CamelCase text as lower-case words (MultiLevelCascade -> multi, level, cascade)."""
    return list(_token_tuple(text))


@functools.lru_cache(maxsize=8192)
def _token_tuple(text: str) -> tuple[str, ...]:
    """_tokens, once per text: every switch asks again of each difference and call branch of every file."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", " ", text)
    return tuple(w for w in re.split(r"[^a-z0-9]+", spaced.lower()) if w)


def feature_words(switch: ConfigSwitch) -> tuple[str, ...]:
    words = _tokens(switch.target.rsplit(".", 1)[-1])
    while words and words[0] in _LEAD_WORDS:
        words.pop(0)
    while words and words[-1] in _TAIL_WORDS:
        words.pop()
    return tuple(words)


def turns_off(switch: ConfigSwitch) -> bool:
    """A switch turns its feature off when a disable_* flag is true or any other flag is false/none."""
    name = switch.target.rsplit(".", 1)[-1].lower()
    value = switch.value.strip().strip("'\"").rsplit(".", 1)[-1].lower()
    if name.startswith(("disable", "no_", "skip")):
        return value in _ON_VALUES
    return value in _OFF_VALUES


def unconditional(switch: ConfigSwitch) -> bool:
    """Set on every run of the platform, not only for some models (which would be a partial path)."""
    parts = [p.strip() for part in switch.condition.split(" / ") for p in part.split(" and ")]
    return all(not p or _NONE_GUARD.match(p) for p in parts)


def _mentions(text: str, words: tuple[str, ...]) -> bool:
    """The feature's words appear together, in order: `use_cascade` yes, `prefix_output` not for mm_prefix_lm."""
    toks = _token_tuple(text)
    n = len(words)
    return any(tuple(toks[i : i + n]) == words for i in range(len(toks) - n + 1))


def behind(branch: str, words: tuple[str, ...]) -> bool:
    """Only runs when the feature is on: some condition requires it, un-negated and not or-ed away.

    `not attn_metadata.use_cascade` is the path that does run with cascade off, so it is no hit;
    `use_cascade or x` may run without the feature, so it is no hit either.
    """
    for part in branch.split(" / "):
        if " or " in part:
            continue
        for cond in part.split(" and "):
            cond = cond.strip().strip("()").strip()
            if _mentions(cond, words) and not cond.startswith("not ") and not re.search(r"(is|==)\s*(False|None)\s*$", cond):
                return True
    return False


def check_inactive_paths(discovery: Discovery, comparison: Comparison | None, trace: TraceResult | None,
                         ) -> Iterator[Finding]:
    """Differences and traced calls, in every file the report covers, that only run when a feature
    is on which the platform turns off unconditionally."""
    calls = calls_by_path(trace)
    paths = {f.path for f in discovery.files} | ({f.path for f in comparison.files} if comparison else set())
    if trace is not None:
        paths |= set(trace.reached_files)
    diffs: dict[str, tuple[Difference, ...]] = {f.path: f.differences for f in comparison.files} if comparison else {}
    for switch in sorted(discovery.switches, key=lambda s: (s.location, s.target)):
        words = feature_words(switch)
        if not words or not turns_off(switch) or not unconditional(switch):
            continue
        for path in sorted(paths):
            if path == switch.location.path:
                continue  # the file that flips the switch is not behind it
            hits: list[tuple[int, str]] = []
            for d in diffs.get(path, ()):
                # A removed item is not retained, and the switch itself is not behind the switch.
                if d.line and d.kind not in ("feature-disabled", "removed") and _mentions(" ".join((d.symbol, d.detail, d.reason)), words):
                    hits.append((d.line, f"{path}:{d.line}: {'declared' if d.declared else 'undeclared'} {d.kind} difference in {d.symbol or 'module'}"))
            for c in calls.get(path, ()):
                if behind(c.branch, words):
                    hits.append((c.location.line, f"{path}:{c.location.line}: call {c.callee_text} under branch `{c.branch}`"))
            if not hits:
                continue
            hits = sorted(set(hits))
            shown = [h[1] for h in hits[:10]]
            if len(hits) > 10:
                shown.append(f"... and {len(hits) - 10} more places")
            cond = f" when {switch.condition}" if switch.condition else ""
            yield make_finding(
                INACTIVE_PATH.id,
                Location(path, hits[0][0], switch.target),
                f"{len(hits)} place(s) in this file depend on '{' '.join(words)}', which the platform turns off "
                f"({switch.target} = {switch.value}{cond}); kept, but it never runs here and nothing validates it",
                [f"switch: {switch.location}: {switch.target} = {switch.value}{cond}", *shown],
            )
