"""Resolve a ScriptTarget to a function, in the scheduler process."""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from typing import Callable, Dict, Tuple

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
    name = "_scripted_runtime_script_" + hashlib.sha1(path.encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    directory = os.path.dirname(path)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    spec.loader.exec_module(module)
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
        for part in target.qualname.split("."):
            obj = getattr(obj, part)
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
