"""Find the installed top-level ``kernels`` package that this folder shadows (see ``__init__``)."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType


def load_installed_kernels(this_init: str) -> ModuleType | None:
    """Import the ``kernels`` package found on ``sys.path`` outside this repository, or None.

    ``this_init`` is this folder's ``__init__.py``; every ``sys.path`` entry that resolves to the
    folder holding it (the repository root, or ``""`` for the working directory) is skipped.
    """
    root = os.path.dirname(os.path.dirname(os.path.abspath(this_init)))
    others = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != root]
    spec = importlib.machinery.PathFinder.find_spec("kernels", others)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs, as the import system does, so its own `from kernels.x import y` work.
    sys.modules["kernels"] = module
    spec.loader.exec_module(module)
    return module
