"""Where a module given by name lives, for processes that must import it
too (scheduler ranks): the directory to put on their PYTHONPATH. Shared by
patches (``hooks/patches.py``) and extensions (``extensions.py``)."""
from __future__ import annotations

import importlib.util
import os
from typing import Optional


def search_root(module: str) -> Optional[str]:
    """The directory from which ``module`` (dotted) imports, or None if it
    cannot be found on this interpreter's path."""
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None or not found.origin:
        return None
    root = os.path.dirname(found.origin)
    depth = module.count(".") + (1 if os.path.basename(found.origin) == "__init__.py" else 0)
    for _ in range(depth):
        root = os.path.dirname(root)
    return root
