"""Resolve a ScriptTarget to a function, in the scheduler process (the
file and attribute lookups are ``scripted_runtime/specs.py``'s)."""
from __future__ import annotations

import importlib
import os
import sys
from typing import Callable, Dict, Tuple

from scripted_runtime import specs
from scripted_runtime.protocol import ScriptTarget

# path -> (mtime, module): a scenario file edited between runs is reloaded.
_loaded: Dict[str, Tuple[float, object]] = {}


class ScriptLoadError(Exception):
    pass


def _module_from_path(path: str):
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise ScriptLoadError(f"script file not found: {path}")
    mtime = os.path.getmtime(path)
    cached = _loaded.get(path)
    if cached is not None and cached[0] == mtime:
        return cached[1]
    directory = os.path.dirname(path)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    module = specs.import_file(path, specs.module_name_for(path, "_scripted_runtime_script_"))
    _loaded[path] = (mtime, module)
    return module


def load(target: ScriptTarget) -> Callable:
    try:
        if target.path:
            obj = _module_from_path(target.path)
        elif target.module:
            obj = importlib.import_module(target.module)
        else:
            raise ScriptLoadError("script target names neither a file nor a module")
        obj = specs.get_qualname(obj, target.qualname)
    except ScriptLoadError:
        raise
    except AttributeError as exc:
        raise ScriptLoadError(f"{target.describe()}: no such function ({exc})") from exc
    except Exception as exc:
        raise ScriptLoadError(
            f"{target.describe()}: importing the script failed: {type(exc).__name__}: {exc}"
        ) from exc
    if not callable(obj):
        raise ScriptLoadError(f"{target.describe()} is a {type(obj).__name__}, not a function")
    return obj
