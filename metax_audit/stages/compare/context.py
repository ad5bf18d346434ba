# The comparison context of one file pair: how a difference is made, declared (vendor comments)
# and whether the port ever calls the code it sits in.
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, replace

from metax_audit.core.models import Difference, DifferenceKind
from metax_audit.core.pysource import dump, unparse
from metax_audit.stages.compare.consequence import VendorPlatform
from metax_audit.stages.compare.counterparts import FileCounterpart
from metax_audit.stages.compare.memo import MemberUnits, Recorder
from metax_audit.stages.compare.rules import ACTIONS
from metax_audit.stages.compare.side import _LEGAL, _Env, _is_code, _short, _Side, _squash, _start


@dataclass
class _Ctx:
    port: _Side
    up: _Side
    cp: FileCounterpart
    rename: dict[str, str]
    up_comments: set[str]
    base: _Side | None = None  # the upstream release the port was synced to, when known
    in_scope: frozenset[str] = frozenset()  # dotted modules of the files under review
    env: _Env | None = None
    port_names: frozenset[str] = frozenset()  # names the port defines or imports from its own package
    units: MemberUnits | None = None  # the file's kept member units (compare/memo.py), None: compute every member

    @property
    def platform(self) -> VendorPlatform:
        return self.env.platform if self.env is not None else VendorPlatform()

    @property
    def log(self) -> Recorder | None:
        """Where a member unit's reads of the rest of the port are logged while it is computed."""
        return self.units.recorder if self.units is not None else None

    def never_called(self, qual: str, depth: int = 0) -> str:
        """Evidence that the port never calls this function (module-level or private), or "": every
        reference to its name in the port package lies in its own body or in functions never called."""
        found = self._never_called(qual, depth)
        if depth == 0 and self.units is not None:
            self.units.recorder.note(("never-called", qual), found)
        return found

    def built_only_by_port(self, cls: str, qual: str) -> str:
        """Evidence that a difference in `qual` is the port's own design, or "": its class (`cls`, upstream's
        name) is one only the port builds (every reference to the port's class outside its file's imports is a
        call constructing it: none registers, returns, assigns or passes it where upstream could build it),
        and upstream did not change `qual` since the base release (so it is not a sync the port missed)."""
        found = self._built_only_by_port(cls, qual)
        if self.units is not None:
            self.units.recorder.note(("port-only-class", cls, qual), found)
        return found

    def _built_only_by_port(self, cls: str, qual: str) -> str:
        if self.env is None or self.env.base_state == "none":
            return ""  # without the base release a missed sync cannot be told apart
        name = next((p for p, u in self.rename.items() if u == cls), cls)
        node = self.port.classes.get(cls)
        if node is None:
            return ""
        uses = self.env.refs.uses(name, self.port.path, node.lineno, node.lineno)
        if not uses or len(uses) > 20:
            return ""  # none, or more than the references index lists (it stops at 21): not every one is seen
        texts = self.env.refs.texts()
        built: list[str] = []
        for rel, line in uses:
            text = texts.get(rel, "").splitlines()[line - 1] if line > 0 else ""
            stripped = text.strip()
            if stripped.startswith(("from ", "import ")) or stripped.startswith("#"):
                continue
            if not re.search(rf"(?<![\w.]){re.escape(name)}\(", text) or re.search(rf"\b(?:return|yield)\b.*\b{re.escape(name)}\b", text):
                return ""  # named without being built: upstream may be handed the class
            built.append(f"{rel}:{line}")
        if not built or not self._same_since_base(qual):  # the dumps last: two whole functions each
            return ""
        return (f"a class only the port builds ({name}, constructed at {', '.join(built[:3])}; nothing registers or "
                "returns it), and upstream did not change this since the base release: the port's own design")

    def _same_since_base(self, qual: str) -> bool:
        """Upstream's `qual` is the base release's (no base side: nothing to tell, so the same)."""
        if self.base is None:
            return True
        old, new = self.base.funcs.get(qual), self.up.funcs.get(qual)
        return old is not None and new is not None and (old is new or dump(old) == dump(new))

    def port_defines(self, name: str) -> bool:
        """The port file defines a function, attribute or class of this (qualified) name."""
        found = name in self.port.funcs or name in self.port.attrs or name in self.port.classes
        if self.units is not None:
            self.units.recorder.note(("port-member", name), found)
        return found

    def comment_texts(self, first: int, last: int) -> list[str]:
        """The texts of the port's comments on lines first..last."""
        found = [c.text for c in self.port.comments.comments_in(first, last)]
        if self.units is not None:
            rec = self.units.recorder
            rec.note(("comments", rec.line(first), rec.line(last)), found)
        return found

    def _never_called(self, qual: str, depth: int) -> str:
        fn = self.port.funcs.get(qual)
        if fn is None or self.env is None or depth > 3:
            return ""
        short = fn.name
        if "." in qual and not (short.startswith("_") and not short.startswith("__")):
            return ""  # a public method may be called by the framework through its base class
        if "." in qual and self._inherited_caller(qual, short):
            return ""
        uses = self.env.refs.uses(short, self.port.path, _start(fn), fn.end_lineno or fn.lineno)
        if uses is None:
            return ""
        callers = []
        for rel, line in uses:
            owner = self._top_function(line) if rel == self.port.path else None
            if owner is None or not self.never_called(owner, depth + 1):
                return ""
            callers.append(owner)
        via = f" (only from {', '.join(sorted(set(callers)))}, itself never called)" if callers else ""
        return f"{qual} is never referenced in the port package outside its own definition{via}"

    def _inherited_caller(self, qual: str, short: str) -> bool:
        """The port class has a base class and upstream's file calls the method: code the port inherits may call it."""
        cls = self.port.classes.get(qual.rsplit(".", 1)[0])
        if cls is None or not cls.bases:
            return False
        ufn = self.up.funcs.get(qual)
        first, last = (_start(ufn), ufn.end_lineno or ufn.lineno) if ufn is not None else (0, 0)
        for m in re.finditer(rf"(?<![\w]){re.escape(short)}(?![\w])", self.up.text):
            line = self.up.text.count("\n", 0, m.start()) + 1
            if not first <= line <= last:
                return True
        return False

    def _top_function(self, line: int) -> str | None:
        for qual, fn in self.port.funcs.items():
            if "." not in qual and _start(fn) <= line <= (fn.end_lineno or fn.lineno):
                return qual
        return None

    def diff(self, kind: DifferenceKind, line: int, symbol: str, detail: str, span: tuple[int, int] | None = None,
             upstream_line: int | None = None) -> Difference:
        first, last = span or (line, line)
        declared, reason = self.declaration(first, last)
        action, validation = ACTIONS.get(kind, ACTIONS["changed"])
        return Difference(kind, self.port.path, line, symbol, declared, reason, action, validation, detail, upstream_line)

    def declaration(self, first: int, last: int) -> tuple[bool, str]:
        found = self._declaration(first, last)
        if self.units is not None:
            rec = self.units.recorder
            rec.note(("decl", rec.line(first), rec.line(last)), found)
        return found

    def _declaration(self, first: int, last: int) -> tuple[bool, str]:
        cm = self.port.comments
        block = cm.block_for(first, last)
        if block is not None:
            return True, _short(block.reason) or "Metax Modification block (no reason written)"
        # A vendor comment in or directly above the changed statement declares it (a marker anywhere in it
        # is a block above); a comment copied from upstream explains upstream's code, and a commented-out
        # argument is the change itself, not its reason.
        words = self.env.vendor_words if self.env is not None else frozenset()
        inside = [c.text for c in cm.comments_in(first, last) if not c.trailing and not _is_code(c.text)
                  and any(w in c.text.lower() for w in words) and not _LEGAL.search(c.text)]
        for lines in (cm.lines_above(first), cm.trailing_lines(first, last), inside):
            if any(_squash(t) not in self.up_comments and not _is_code(t) for t in lines):
                return True, _short(" ".join(lines))
        return False, ""

    def mentioned(self, name: str) -> tuple[bool, str]:
        """A vendor comment anywhere in the port names `name`: declares why it was dropped."""
        short = name.rsplit(".", 1)[-1]
        pattern = re.compile(rf"(?<![\w]){re.escape(short)}(?![\w])")
        cm = self.port.comments
        for line, c in sorted(cm.comments.items()):
            if pattern.search(c.text) and _squash(c.text) not in self.up_comments:
                block = cm.block_for(line)
                text = block.reason if block is not None and block.reason else " ".join(cm.run_at(line) or [c.text])
                return True, _short(text)
        return False, ""

    def removal(self, kind: DifferenceKind, anchor: int, symbol: str, detail: str, upstream_line: int | None) -> Difference:
        d = self.diff(kind, anchor, symbol, detail, (anchor, anchor) if anchor else (0, 0), upstream_line)
        if not d.declared:
            declared, reason = self.mentioned(symbol)
            if declared:
                d = replace(d, declared=True, reason=reason)
        return d


def _parent_missing(name: str, other: dict[str, ast.ClassDef], same: dict[str, ast.ClassDef]) -> bool:
    return "." in name and name.rsplit(".", 1)[0] not in other


def _inherits(cls: ast.ClassDef, upstream_name: str) -> bool:
    """The port class subclasses the upstream class of the same (mapped) name."""
    short = upstream_name.rsplit(".", 1)[-1]
    for base in cls.bases:
        text = unparse(base)
        if text.split("[")[0].rsplit(".", 1)[-1] == short and cls.name != short:
            return True
    return False


def _anchor(ctx: _Ctx, qual: str) -> int:
    """Port line where an upstream member would sit: after its nearest preceding sibling."""
    order = ctx.up.order
    idx = order.index(qual) if qual in order else -1
    for prev in reversed(order[:idx]):
        node = ctx.port.funcs.get(prev) or ctx.port.attrs.get(prev) or ctx.port.classes.get(prev)
        if node is not None:
            return (node.end_lineno or node.lineno) + 1
    owner = qual.rsplit(".", 1)[0] if "." in qual else ""
    cls = ctx.port.classes.get(owner)
    return cls.lineno if cls is not None else 0
