"""Extension points: a window, an invariant and an explorer action from a
module of your own, without editing this package.

In ``my_checks.py``::

    from scripted_runtime import extensions as ext

    @ext.window(loops=("normal", "overlap", "pp"), source="my issue")
    def two_waiting(scheduler):
        "Two or more requests wait in the queue."
        n = len(scheduler.waiting_queue)
        return f"waiting={n}" if n >= 2 else None

    @ext.invariant
    def rows_within_pool(view):
        "No request holds a req_to_token row beyond the pool."
        ...  # return a message when broken, else None

    @ext.action
    def flush_twice(ctx, reqs):
        "Two flush_cache posts in the same iteration."
        ...  # a generator over the context API, like a scenario

``--extension my_checks.py`` (``run``, ``explore``; the pytest plugin's
``--scripted-runtime-extension`` and its marker's ``extensions=[...]``)
loads the module in the harness and in every scheduler rank:

* a **window** is a predicate over the scheduler (``None`` when closed,
  else a short detail), evaluated each iteration like the built-in ones
  (``scheduler_side/windows.py``): hit counts in every result, waitable
  with ``ctx.wait_for_window``, and drawn by the explorer's "when window W
  opens" action;
* an **invariant** receives the ``invariants.StateView`` after every
  iteration and returns a message when broken: the script fails with
  ``InvariantViolation[NAME]``; ``--skip-invariant NAME`` turns it off;
* an **action** is a generator ``(ctx, reqs)`` the explorer draws among
  its actions (``reqs``: the program's request handles so far); its runs
  are a row of the coverage table.

The names are the functions' names; one that clashes with a built-in or
another extension is an ``ExtensionError``. This module is plain Python
(no SGLang import): it is loaded by both sides.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from scripted_runtime import specs as spec_forms

ENV_EXTENSIONS = "SCRIPTED_RUNTIME_EXTENSIONS"
ALL_LOOPS = ("normal", "overlap", "pp")


class ExtensionError(ValueError):
    """An extension that cannot be loaded or registered (one line)."""


@dataclass(frozen=True)
class WindowExtension:
    name: str
    fn: Callable[[Any], Optional[str]] = field(repr=False)  # the predicate: fn(scheduler)
    doc: str
    loops: Tuple[str, ...] = ALL_LOOPS
    source: str = "extension"


@dataclass(frozen=True)
class InvariantExtension:
    name: str
    fn: Callable[[Any], Optional[str]] = field(repr=False)  # the check: fn(view) -> message or None
    doc: str


@dataclass(frozen=True)
class ActionExtension:
    name: str
    fn: Callable[..., Any] = field(repr=False)  # the action: a generator fn(ctx, reqs)
    doc: str


_windows: Dict[str, WindowExtension] = {}
_invariants: Dict[str, InvariantExtension] = {}
_actions: Dict[str, ActionExtension] = {}
_loaded: List[str] = []  # specs loaded in this process, in order
_registered: set = set()  # extension windows put in the window table by register_windows


def _doc(fn: Callable) -> str:
    return (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""


def _claim(f: Callable, kind: str) -> None:
    """``f``'s name is free, or taken by this same function: its module
    imported again (a scenario file that is also the extension module is
    imported by the script loader too), which re-registers it."""
    for other_kind, table in (("window", _windows), ("invariant", _invariants), ("action", _actions)):
        taken = table.get(f.__name__)
        if taken is None:
            continue
        fn = taken.fn
        same = other_kind == kind and getattr(fn, "__code__", None) is not None and \
            (fn.__code__.co_filename, fn.__qualname__) == (f.__code__.co_filename, f.__qualname__)
        if not same:
            raise ExtensionError(f"extension {kind} {f.__name__!r}: the name is already an extension {other_kind}")


def window(fn: Optional[Callable] = None, *, loops: Sequence[str] = ALL_LOOPS, source: str = "extension",
           doc: str = ""):
    """Register ``fn(scheduler) -> Optional[str]`` as a window."""
    bad = [loop for loop in loops if loop not in ALL_LOOPS]
    if bad:
        raise ExtensionError(f"extension window: unknown loop kind(s) {bad}; known: {', '.join(ALL_LOOPS)}")

    return _registrar(fn, "window", _windows,
                      lambda f: WindowExtension(f.__name__, f, doc or _doc(f), tuple(loops), source))


def invariant(fn: Optional[Callable] = None, *, doc: str = ""):
    """Register ``fn(view) -> Optional[str]`` (a message when broken) as an invariant."""
    return _registrar(fn, "invariant", _invariants, lambda f: InvariantExtension(f.__name__, f, doc or _doc(f)))


def action(fn: Optional[Callable] = None, *, doc: str = ""):
    """Register the generator ``fn(ctx, reqs)`` as an explorer action."""
    return _registrar(fn, "action", _actions, lambda f: ActionExtension(f.__name__, f, doc or _doc(f)))


def _registrar(fn: Optional[Callable], kind: str, table: Dict[str, Any], make: Callable[[Callable], Any]):
    """The decorator (used bare, ``@ext.window``, or called, ``@ext.window(...)``)
    that puts ``make(f)`` in ``table`` under ``f``'s name."""

    def register(f: Callable) -> Callable:
        _claim(f, kind)
        table[f.__name__] = make(f)
        return f

    return register(fn) if fn is not None else register


def windows() -> Dict[str, WindowExtension]:
    return dict(_windows)


def invariants() -> Dict[str, InvariantExtension]:
    return dict(_invariants)


def actions() -> Dict[str, ActionExtension]:
    return dict(_actions)


def get_action(name: str) -> ActionExtension:
    try:
        return _actions[name]
    except KeyError:
        raise ExtensionError(f"no extension action {name!r} is loaded here (loaded: {', '.join(_actions) or 'none'};"
                             f" pass --extension with the module that defines it)") from None


def _parse(spec: str) -> spec_forms.Spec:
    try:
        return spec_forms.parse(spec, what="extension", attribute=False)
    except spec_forms.SpecError as exc:
        raise ExtensionError(str(exc)) from None


def resolve(spec: str) -> Tuple[str, Optional[str]]:
    """``(spec to pass to the ranks, a directory to put on their PYTHONPATH)``
    for ``MODULE`` or ``PATH.py``; an ``ExtensionError`` if it is not found."""
    parsed = _parse(spec)
    if parsed.is_file:
        if parsed.source_file() is None:
            raise ExtensionError(f"extension {parsed.text!r}: file not found")
        return parsed.canonical, None
    top = parsed.search_root()
    if top is None:
        raise ExtensionError(f"extension {parsed.text!r}: no such module (a MODULE importable here, or PATH.py)")
    return parsed.canonical, top


def load(specs: Iterable[str]) -> List[str]:
    """Import each ``MODULE`` or ``PATH.py`` (once per process): their
    decorators register what they define. Returns the specs loaded."""
    for spec in specs:
        spec = spec.strip()
        if not spec or spec in _loaded:
            continue
        parsed = _parse(spec)
        try:
            parsed.import_module("scripted_runtime_extension_" + parsed.stem if parsed.is_file else None)
        except ExtensionError:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's module: name it and what it raised
            raise ExtensionError(f"extension {spec!r} failed to load: {type(exc).__name__}: {exc}") from exc
        _loaded.append(spec)
    return list(_loaded)


def requested() -> List[str]:
    """The specs the harness passed to this scheduler rank."""
    return [s for s in os.environ.get(ENV_EXTENSIONS, "").split(",") if s]


def install_requested(scheduler_module: Any = None) -> None:
    """In a scheduler rank: load the requested extensions and add their
    windows to the window table (``hooks`` calls it when the scheduler
    module is imported)."""
    activate(requested())


def register_windows() -> None:
    """Add the loaded windows to ``scheduler_side.windows.WINDOWS`` (the
    tracker, ``ctx.wait_for_window`` and the explorer read it); a name that
    is a built-in window is an ``ExtensionError`` (a built-in check's name:
    ``invariants.all_names``)."""
    from scripted_runtime.scheduler_side import windows as window_table

    for ext in _windows.values():
        if ext.name in window_table.BUILTIN and ext.name not in _registered:
            raise ExtensionError(f"extension window {ext.name!r}: a built-in window has that name")
        window_table.WINDOWS[ext.name] = window_table.Window(ext.name, ext.loops, ext.source, ext.doc, ext.fn)
        _registered.add(ext.name)



def activate(specs: Iterable[str]) -> None:
    """Load ``specs`` in this (harness) process and register their windows:
    what ``--extension`` does before anything starts."""
    load(specs)
    register_windows()


def summary() -> Dict[str, List[str]]:
    """What is loaded, by kind (the server's info and ``run`` print it)."""
    return {"windows": sorted(_windows), "invariants": sorted(_invariants), "actions": sorted(_actions)}


def loaded_line(info: Dict[str, Any]) -> Optional[str]:
    """``extensions loaded in the scheduler: ...`` from a server's info (its
    rank's ``summary``), or None when it loaded none."""
    loaded = info.get("extensions") or {}
    if not any(loaded.values()):
        return None
    return "extensions loaded in the scheduler: " + "; ".join(
        f"{kind} {', '.join(names)}" for kind, names in loaded.items() if names)
