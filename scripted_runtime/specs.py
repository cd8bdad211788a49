"""Specs: how a user names a Python object of their own to the harness
(a scenario, a patch, an extension), parsed and loaded by one set of rules.

The forms:

* ``PATH.py:NAME``: ``NAME`` (a qualname: ``fn`` or ``Class.method``) in a
  Python file, relative to the current directory or absolute;
* ``MODULE:NAME``: ``NAME`` in an importable module (``pkg.mod:fn``);
* ``PATH.py`` or ``MODULE`` alone where no attribute is wanted
  (extensions: ``parse(..., attribute=False)``).

The part before the last ``:`` names a FILE when it ends with ``.py`` or
contains a path separator (``/``, or ``os.sep``); otherwise it is a dotted
MODULE name. That one rule (``names_a_file``) decides it everywhere.

A ``Spec`` carries a ``label`` safe as a file or folder name (``mod.NAME``:
the file's stem or the module, then the qualname; never a directory), so an
output keyed by a spec stays under the folder it is put in, whatever the
form of the spec.

Plain Python, no SGLang or ``user_side`` import: the user's process and the
scheduler ranks both use it. Bad specs raise ``SpecError``, a one-line
``UsageError`` (also a ``ValueError``) naming the spec and what is wrong.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Optional

from scripted_runtime.errors import UsageError

FILE, MODULE = "file", "module"
ATTR_FORMS = "PATH.py:NAME or MODULE:NAME"
MODULE_FORMS = "PATH.py or MODULE"


class SpecError(UsageError, ValueError):
    """A spec that does not parse, or names nothing that exists (one line)."""


def names_a_file(where: str) -> bool:
    """The one rule: ``where`` is a file path (else a dotted module name)."""
    return where.endswith(".py") or "/" in where or os.sep in where


def _is_dotted_name(text: str) -> bool:
    return bool(text) and all(part.isidentifier() for part in text.split("."))


def safe_name(text: str) -> str:
    """``text`` with every character but letters, digits, ``_ . -`` made ``_``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


@dataclass(frozen=True)
class Spec:
    text: str  # as given (stripped)
    kind: str  # FILE or MODULE
    where: str  # the absolute file path (FILE) or the dotted module name (MODULE)
    attr: str = ""  # the qualname in it; "" for a module-only spec

    @property
    def is_file(self) -> bool:
        return self.kind == FILE

    @property
    def given_where(self) -> str:
        """The file or module part as written (a path not made absolute)."""
        return self.text.rpartition(":")[0] if self.attr else self.text

    @property
    def stem(self) -> str:
        """The file's name without ``.py``, or the module's dotted name."""
        if not self.is_file:
            return self.where
        base = os.path.basename(self.where)
        return (base[:-3] if base.endswith(".py") else base) or "file"

    @property
    def label(self) -> str:
        """A file-name-safe name for outputs keyed by this spec: ``stem.attr``
        (``my_mutants.NAME``, ``pkg.mod.NAME``); never holds a directory."""
        name = safe_name(f"{self.stem}.{self.attr}" if self.attr else self.stem).strip(".")
        return name if name not in ("", ".", "..") else "spec"

    @property
    def short(self) -> str:
        """For tables: ``file.py:NAME`` for a file (no directory), the spec
        as given for a module."""
        if not self.is_file:
            return self.text
        base = os.path.basename(self.where)
        return f"{base}:{self.attr}" if self.attr else base

    @property
    def canonical(self) -> str:
        """The spec with an absolute path: what to pass to another process."""
        return f"{self.where}:{self.attr}" if self.attr else self.where

    def source_file(self) -> Optional[str]:
        """The ``.py`` file that holds it (found without importing it), or
        None if there is none."""
        if self.is_file:
            return self.where if os.path.isfile(self.where) else None
        found = _find_spec(self.where)
        if found is None or not found.origin or not found.origin.endswith(".py"):
            return None
        return found.origin

    def search_root(self) -> Optional[str]:
        """For a MODULE spec, the directory its module imports from (to put
        on a child's PYTHONPATH); None for a file or a module not found."""
        return None if self.is_file else search_root(self.where)

    def import_module(self, file_module_name: Optional[str] = None) -> ModuleType:
        """Import the module (a FILE is executed afresh as
        ``file_module_name``, by default one named after its path)."""
        if self.is_file:
            return import_file(self.where, file_module_name or module_name_for(self.where))
        return importlib.import_module(self.where)

    def load(self, file_module_name: Optional[str] = None) -> Any:
        """The object the spec names (the module itself for a module-only
        spec). Raises whatever importing or the lookup raises."""
        return get_qualname(self.import_module(file_module_name), self.attr)


def parse(text: str, *, what: str = "spec", forms: Optional[str] = None, attribute: bool = True) -> Spec:
    """Parse ``PATH.py:NAME`` / ``MODULE:NAME`` (or, with
    ``attribute=False``, ``PATH.py`` / ``MODULE``); a FILE's path is made
    absolute. Nothing is imported or looked up. ``what`` and ``forms`` word
    the ``SpecError`` (``patch 'x': expected ...``)."""
    text = str(text).strip()
    forms = forms or (ATTR_FORMS if attribute else MODULE_FORMS)

    def bad(detail: str = "") -> SpecError:
        return SpecError(f"{what} {text!r}: expected {forms}" + (f" ({detail})" if detail else ""))

    if attribute:
        where, sep, attr = text.rpartition(":")
        if not sep or not where or not attr:
            raise bad()
        if not _is_dotted_name(attr):
            raise bad(f"{attr!r} is not a Python name")
    else:
        where, attr = text, ""
        if not where:
            raise bad()
    if names_a_file(where):
        return Spec(text=text, kind=FILE, where=os.path.abspath(where), attr=attr)
    if not _is_dotted_name(where):
        raise bad(f"{where!r} is neither a path nor a dotted module name")
    return Spec(text=text, kind=MODULE, where=where, attr=attr)


def _find_spec(module: str):
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None


def search_root(module: str) -> Optional[str]:
    """The directory from which ``module`` (dotted) imports, or None if it
    cannot be found on this interpreter's path."""
    found = _find_spec(module)
    if found is None or not found.origin:
        return None
    root = os.path.dirname(found.origin)
    depth = module.count(".") + (1 if os.path.basename(found.origin) == "__init__.py" else 0)
    for _ in range(depth):
        root = os.path.dirname(root)
    return root


def module_name_for(path: str, prefix: str = "_scripted_runtime_file_") -> str:
    """A module name for a file, the same for the same absolute path."""
    return prefix + hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:12]


def import_file(path: str, module_name: str) -> ModuleType:
    """Execute the Python file ``path`` as a new module ``module_name``,
    registered in ``sys.modules`` (so its dataclasses and pickles resolve).
    Any file named as a FILE is read as Python source, ``.py`` or not."""
    loader = importlib.machinery.SourceFileLoader(module_name, path)
    module_spec = importlib.util.spec_from_file_location(module_name, path, loader=loader)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def get_qualname(obj: Any, qualname: str) -> Any:
    """``obj.a.b`` for ``qualname`` ``a.b`` (``obj`` itself for "")."""
    for part in qualname.split(".") if qualname else ():
        obj = getattr(obj, part)
    return obj
