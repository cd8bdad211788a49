"""Where things live on disk, for processes that must import them too
(scheduler ranks, another build's environment): the harness itself (a
checkout or an installed wheel), its hooks and their ``sitecustomize``. (The
directory a user's module given by name imports from is
``specs.search_root``.)"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Optional


PACKAGE_DIR = Path(__file__).resolve().parent


def checkout_hooks_dir() -> Optional[str]:
    """The checkout's top-level ``hooks/`` when this package runs from a
    checkout (an editable install, or the checkout on PYTHONPATH), else None
    (installed from the wheel: the hooks are a real subpackage). The one
    place that tells the two layouts apart: the package root maps
    ``scripted_runtime.hooks`` by it, and the paths below follow it."""
    if (PACKAGE_DIR / "hooks").is_dir():
        return None
    folder = PACKAGE_DIR.parent / "hooks"
    return str(folder) if (folder / "__init__.py").is_file() else None


def hooks_dir() -> Path:
    """Where ``scripted_runtime.hooks`` lives: ``hooks/`` in a checkout, the
    subpackage in a wheel."""
    hooks = checkout_hooks_dir()
    return Path(hooks) if hooks is not None else PACKAGE_DIR / "hooks"


def site_dir() -> Path:
    """The folder holding the ``sitecustomize`` every SGLang process loads."""
    return hooks_dir() / "_site"


def harness_path_entry() -> str:
    """A PYTHONPATH entry from which ``scripted_runtime`` imports, and nothing
    else of this environment: the checkout root, or for an installed wheel a
    private folder holding only a link to the package (the whole
    site-packages on another build's PYTHONPATH would shadow its packages)."""
    hooks = checkout_hooks_dir()
    if hooks is not None:
        return str(Path(hooks).parent)  # the checkout root
    tag = hashlib.sha1(str(PACKAGE_DIR).encode()).hexdigest()[:12]
    folder = Path(tempfile.gettempdir()) / f"scripted-runtime-path-{os.getuid()}-{tag}"
    link = folder / "scripted_runtime"
    if not (link.is_symlink() and os.readlink(link) == str(PACKAGE_DIR)):
        folder.mkdir(mode=0o700, exist_ok=True)
        tmp = folder / f".link.{os.getpid()}"
        if tmp.is_symlink():
            tmp.unlink()
        tmp.symlink_to(PACKAGE_DIR, target_is_directory=True)
        tmp.replace(link)
    return str(folder)
