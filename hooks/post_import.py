"""Run a callback right after a named module finishes importing.

Patching at import time this way costs nothing in processes that never import
the module (the tokenizer and detokenizer processes never import the
scheduler), and it works in spawned children where nothing else of ours runs.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Callable, Dict, List

_callbacks: Dict[str, List[Callable]] = {}


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, wrapped: importlib.abc.Loader, name: str) -> None:
        self._wrapped = wrapped
        self._name = name

    def create_module(self, spec):
        return self._wrapped.create_module(spec)

    def exec_module(self, module) -> None:
        self._wrapped.exec_module(module)
        for callback in _callbacks.pop(self._name, []):
            callback(module)

    def __getattr__(self, item):
        return getattr(self._wrapped, item)


def find_spec_elsewhere(own: importlib.abc.MetaPathFinder, fullname, path, target=None):
    """The spec the import system would find without ``own`` (a finder of
    ours that wraps the real loader), or None."""
    for finder in sys.meta_path:
        if finder is own:
            continue
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        spec = find(fullname, path, target)
        if spec is not None and spec.loader is not None:
            return spec
    return None


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _callbacks:
            return None
        spec = find_spec_elsewhere(self, fullname, path, target)
        if spec is not None:
            spec.loader = _PatchingLoader(spec.loader, fullname)
        return spec


_finder = _PostImportFinder()


def when_imported(module_name: str, callback: Callable) -> None:
    """Call ``callback(module)`` once ``module_name`` is imported (now if it already is)."""
    if module_name in sys.modules:
        callback(sys.modules[module_name])
        return
    _callbacks.setdefault(module_name, []).append(callback)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
