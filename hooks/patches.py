"""Named in-process patches of SGLang, applied in every scheduler rank: the
one mechanism behind fix toggles (``hooks/fix_toggles.py``: undo a fix),
mutants (``hooks/mutants/``: plant a plausible bug, to measure what the
harness catches) and a user's own patches from a module outside this repo.

A patch SPEC is one of:

* ``NAME``: a built-in fix toggle, mutant or workaround of a registered bug
  (``pr27446``, ``mut_abort_keeps_row``, ``fence_pp_profiler_stop``: ``hooks/workarounds.py``);
* ``MODULE:ATTR``: ``ATTR`` of an importable module (``mypkg.mutants:skip_prune``);
* ``PATH.py:ATTR``: ``ATTR`` of a Python file.

(``MODULE:ATTR`` and ``PATH.py:ATTR`` are parsed and loaded by
``scripted_runtime/specs.py``, as scenario and extension specs are.)

``ATTR`` is a ``Patch`` (or a ``FixToggle``), or a plain function
``install(scheduler_module)``; its docstring's first line is then its summary.

The user side validates the specs (``check``, nothing imported) and passes
them in ``SCRIPTED_RUNTIME_PATCHES`` (comma-separated, paths absolute) with
the directories their modules need on ``PYTHONPATH``; when the scheduler
module is imported in a rank, ``install_requested`` applies each in order.
A patch that cannot apply to the installed release raises ``PatchError``,
which fails the server start with its message.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from scripted_runtime.hooks import fix_toggles, mutants, workarounds
from scripted_runtime.hooks.patch_base import Patch, PatchError
from scripted_runtime import protocol, specs

ENV_PATCHES = protocol.ENV_PATCHES
__all__ = ["Patch", "PatchError", "check", "load", "install_requested"]


def _builtin() -> Dict[str, Any]:
    out: Dict[str, Any] = dict(fix_toggles.TOGGLES)
    for kind, table in (("mutant", mutants.MUTANTS), ("workaround", workarounds.WORKAROUNDS)):
        for name, patch in table.items():
            if name in out:
                raise PatchError(f"patch name {name!r} is both a {kind} and another built-in patch")
            out[name] = patch
    return out


def builtin_names() -> List[str]:
    return sorted(_builtin())


@dataclass(frozen=True)
class Resolved:
    spec: str  # as passed to the scheduler ranks
    search_path: Optional[str] = None  # a directory to put on PYTHONPATH for it


PATCH_FORMS = "NAME, MODULE:ATTR or PATH.py:ATTR"


def _parse(spec: str) -> specs.Spec:
    return specs.parse(spec, what="patch", forms=PATCH_FORMS)


def label(spec: str) -> str:
    """A file-name-safe name for outputs keyed by SPEC: a built-in's NAME,
    else the spec's label (``my_mutants.NAME``: never a directory)."""
    spec = spec.strip()
    return spec if ":" not in spec else _parse(spec).label


def check(spec: str) -> Resolved:
    """Validate one SPEC in the user's process without importing it; a
    ``SpecError`` (a ValueError) names what is wrong and what is known."""
    spec = spec.strip()
    if ":" not in spec:
        known = _builtin()
        if spec not in known:
            raise specs.SpecError(f"unknown patch {spec!r}; built-in: {', '.join(sorted(known))} "
                                  "(or MODULE:ATTR / PATH.py:ATTR for one of your own)")
        return Resolved(spec)
    parsed = _parse(spec)
    where, attr = parsed.given_where, parsed.attr
    if parsed.is_file:
        path = parsed.source_file()
        if path is None:
            raise specs.SpecError(f"patch {spec!r}: file not found: {where}")
        with open(path) as f:
            tree = ast.parse(f.read(), filename=path)
        names = {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                 for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
        names |= {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        if attr.split(".")[0] not in names:
            raise specs.SpecError(f"patch {spec!r}: {where} defines no {attr!r}")
        return Resolved(parsed.canonical)
    root = parsed.search_root()
    if root is None:
        raise specs.SpecError(f"patch {spec!r}: module {where!r} not found on this interpreter's path")
    return Resolved(spec, search_path=root)


def load(spec: str) -> Any:
    """The patch object a SPEC names (in a scheduler rank)."""
    if ":" not in spec:
        known = _builtin()
        if spec not in known:
            raise PatchError(f"unknown patch {spec!r}")
        return known[spec]
    try:
        parsed = _parse(spec)
        obj = parsed.load(specs.module_name_for(parsed.where, "_scripted_runtime_patch_") if parsed.is_file else None)
    except Exception as exc:
        raise PatchError(f"patch {spec}: cannot load it: {type(exc).__name__}: {exc}") from exc
    attr = parsed.attr
    if hasattr(obj, "install") and hasattr(obj, "name"):
        return obj
    if callable(obj):
        doc = (obj.__doc__ or "").strip().splitlines()
        return Patch(name=attr, summary=doc[0] if doc else attr, install=obj)
    raise PatchError(f"patch {spec}: {attr} is a {type(obj).__name__}, not a Patch or a function")


def describe(spec: str) -> str:
    """``NAME (summary)`` for a built-in, the SPEC itself otherwise."""
    patch = _builtin().get(spec)
    return f"{spec} ({patch.summary})" if patch is not None else spec


def requested() -> List[str]:
    return protocol.listed(ENV_PATCHES)


def install_requested(scheduler_module: Any) -> None:
    for spec in requested():
        load(spec).install(scheduler_module)
