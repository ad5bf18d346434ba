# The fence that keeps the port under review out of the introspection worker: a meta-path finder
# first in line, stood before site runs (the parent starts the worker with -S).
from __future__ import annotations

import json
import os
import sys
from typing import Any

# The port under review is never imported here: FENCE_ENV names its top-level packages (JSON list).
FENCE_ENV = "METAX_AUDIT_NEVER_IMPORT"


class Fence:
    """A meta-path finder, first in line, that refuses the port under review: its packages by name,
    and any module whose file lies in the checkout an (editable) install of it points at (a repo
    `sitecustomize.py`, `torch.py`, `json.py`). The parent starts us with -S and enter_site() runs
    site only once the fence stands, so .pth files and sitecustomize meet it too."""

    def __init__(self, names: list[str]) -> None:
        self.names = set(names)
        self._roots: tuple[tuple[str, ...], list[str]] | None = None  # (sys.path it was found on, roots)

    def _others(self) -> list[Any]:
        return [f for f in sys.meta_path if f is not self and hasattr(f, "find_spec")]

    def roots(self) -> list[str]:
        key = tuple(sys.path)  # site adds .pth paths (and finders) after the fence stands: look again
        if self._roots is None or self._roots[0] != key:
            found: list[str] = []
            for name in sorted(self.names):
                for finder in self._others():
                    try:
                        spec = finder.find_spec(name, None)
                    except Exception:
                        spec = None
                    locs = list(getattr(spec, "submodule_search_locations", None) or []) if spec else []
                    for loc in locs:
                        parent = os.path.dirname(os.path.abspath(loc))
                        # a checkout (editable install): the whole tree; site-packages: the package only
                        site_dir = os.path.basename(parent) in ("site-packages", "dist-packages")
                        found.append(os.path.abspath(loc) if site_dir else parent)
                    if spec is not None:
                        break
            self._roots = (key, found)
        return self._roots[1]

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"{name} is the port under review: metax-audit never imports it", name=name)
        if "." in name or not self.names:
            return None  # a submodule's package already passed the check
        roots = self.roots()
        if not roots:
            return None
        for finder in self._others():
            try:
                spec = finder.find_spec(name, path, target)
            except Exception:
                return None
            if spec is None:
                continue
            origin = os.path.abspath(spec.origin) if getattr(spec, "origin", None) and os.path.isabs(str(spec.origin)) else ""
            if any(origin == r or origin.startswith(r + os.sep) for r in roots):
                raise ModuleNotFoundError(f"{name} comes from the port's checkout ({origin}): metax-audit never imports it",
                                          name=name)
            return None
        return None


def enter_site(extra: tuple[str, ...] = ()) -> None:
    """Stand the fence (FENCE_ENV, plus `extra` names), then run site if the parent started us with
    -S for that."""
    try:
        names = [str(n) for n in json.loads(os.environ.get(FENCE_ENV) or "[]")] + list(extra)
    except ValueError:
        names = list(extra)
    if names and not any(isinstance(f, Fence) for f in sys.meta_path):
        sys.meta_path.insert(0, Fence(names))
    if sys.flags.no_site and os.environ.get(FENCE_ENV) is not None and "site" not in sys.modules:
        import site

        site.main()
