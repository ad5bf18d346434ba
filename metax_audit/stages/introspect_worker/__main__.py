# Entry point of the introspection worker: the target interpreter runs this file by path
# (introspect.worker_command), so it loads its own folder as the package and runs protocol.main().
from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType


def _load_package() -> ModuleType:
    """This folder as the package `introspect_worker`, imported from its files: run by path, the
    folder is sys.path[0], and nothing of it (nor of metax-audit) may shadow a module the audited
    stack imports, so that entry goes before anything is imported from it."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.util.spec_from_file_location("introspect_worker", os.path.join(here, "__init__.py"),
                                                  submodule_search_locations=[here])
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = package
    spec.loader.exec_module(package)
    return importlib.import_module("introspect_worker.protocol")


if __name__ == "__main__":
    sys.exit(_load_package().main())
