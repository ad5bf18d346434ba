# CLI-side rendering of one traced backend chain: a rich tree for the terminal and a plain dict
# (the JSON of `metax-audit trace --format json`, same keys as the report's `backends` entries).
from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.tree import Tree

from metax_audit.core.models import BackendChain, CallArg, CallSite, ChainHop

# Hops nest under the class they belong to; everything else hangs off the backend.
_UNDER = {
    "builder": ("build", "builder."),
    "impl": ("init", "forward", "impl."),
    "backend": ("get-builder-cls", "get-impl-cls", "kv-cache-shape", "kv-stride-order"),
}


def _where(path: str, line: int) -> str:
    if not path:
        return "[dim](source not available)[/dim]"
    return f"[cyan]{escape(path)}:{line}[/cyan]" if line else f"[cyan]{escape(path)}[/cyan]"


def _short(qualname: str) -> str:
    """Class or Class.method: the module is in the file path beside it."""
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        if (part[:1].isupper() and i < len(parts) - 1) or i == len(parts) - 1:
            return ".".join(parts[i:]) if part[:1].isupper() else parts[-1]
    return qualname


def _hop_label(h: ChainHop) -> str:
    # Terminal lines stay short: the dotted path is shown where it is the point (what a wrapper
    # or kernel resolves to); the JSON keeps every full name.
    name = h.qualname if h.role in {"registration", "kernel", "layer", "wrapper"} else _short(h.qualname)
    text = f"[bold]{h.role}[/bold] {escape(name)} {_where(h.path, h.line)}"
    if h.resolved and h.role in {"registration", "kernel", "wrapper"} and h.resolved != h.qualname:
        text += f" -> [green]{escape(h.resolved)}[/green]"
    if h.resolved is None and h.role == "backend":
        text += " [red](class not found)[/red]"
    if h.inherited_from:
        text += f" [yellow](inherited from {escape(h.inherited_from)})[/yellow]"
    return text


def _args_text(args: tuple[CallArg, ...]) -> str:
    parts = []
    for a in args:
        item = f"{a.name}={a.text}" if a.name else a.text
        parts.append(f"[strike]{escape(item)}[/strike]" if a.commented_out else escape(item))
    return ", ".join(parts)


def chain_tree(chain: BackendChain) -> Tree:
    state = "[green]active[/green]" if chain.active else "[yellow]not selected[/yellow]"
    head = f"[bold]{escape(chain.name)}[/bold] {escape(chain.class_path)} ({state})"
    if chain.capture_support:
        head += f" cudagraph: {escape(chain.capture_support)}"
    if chain.condition:
        head += f"\nselected when {escape(chain.condition)}"
    tree = Tree(head)
    parents: dict[str, Tree] = {}
    groups: dict[str, Tree] = {}
    for hop in chain.chain:
        parent = tree
        for owner, prefixes in _UNDER.items():
            if owner in parents and any(hop.role == p or (p.endswith(".") and hop.role.startswith(p)) for p in prefixes):
                parent = parents[owner]
                break
        if hop.role in {"wrapper", "kernel", "layer"}:
            if hop.role not in groups:
                groups[hop.role] = tree.add(f"[bold]{hop.role}s[/bold]")
            groups[hop.role].add(_hop_label(hop))
            continue
        node = parent.add(_hop_label(hop))
        if hop.role in _UNDER:
            parents[hop.role] = node
    calls = [c for c in chain.calls if c.origin in {"external", "port", "upstream"}]
    if calls:
        node = tree.add(f"[bold]calls[/bold] ({len(calls)} of {len(chain.calls)}; builtins left out)")
        for c in calls:
            label = f"{escape(c.callee_text)}({_args_text(c.args)}) {_where(c.location.path, c.location.line)}"
            label += f" -> [green]{escape(c.resolved or '?')}[/green] [dim]{c.origin}, {escape(c.via)}[/dim]"
            if c.branch:
                label += f" [magenta]if {escape(c.branch)}[/magenta]"
            node.add(label)
    if chain.unresolved:
        node = tree.add(f"[bold red]unresolved[/bold red] ({len(chain.unresolved)})")
        for u in chain.unresolved:
            node.add(f"{escape(u.text)} {_where(u.location.path, u.location.line)}: {escape(u.reason)}")
    return tree


def _arg(a: CallArg) -> dict[str, Any]:
    return {"name": a.name, "position": a.position, "text": a.text, "literal": a.literal, "commented_out": a.commented_out}


def _call(c: CallSite) -> dict[str, Any]:
    return {
        "path": c.location.path,
        "line": c.location.line,
        "caller": c.caller,
        "callee": c.callee_text,
        "resolved": c.resolved,
        "origin": c.origin,
        "via": c.via,
        "branch": c.branch,
        "args": [_arg(a) for a in c.args],
        "star_args": c.star_args,
        "star_kwargs": c.star_kwargs,
        "partial_args": [_arg(a) for a in c.partial_args],
    }


def chain_to_dict(chain: BackendChain) -> dict[str, Any]:
    """The report's backend record plus every call site the chain walked."""
    from metax_audit.report.json_report import backend_to_dict

    return {**backend_to_dict(chain), "calls": [_call(c) for c in chain.calls]}
