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

Windows and invariants go in the one registry of checks and windows
(``scheduler_side/check_registry.py``), where the built-in ones are
registered the same way; an invariant's ``fn(view) -> message`` is wrapped
there into a check that reports a ``Violation``, like every other check.
The names are the functions' names; one that clashes with a built-in or
another extension is an ``ExtensionError``. This module is plain Python
(no SGLang import): it is loaded by both sides.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from scripted_runtime import specs as spec_forms
from scripted_runtime.scheduler_side import check_registry

ENV_EXTENSIONS = "SCRIPTED_RUNTIME_EXTENSIONS"
ALL_LOOPS = ("normal", "overlap", "pp")


class ExtensionError(ValueError):
    """An extension that cannot be loaded or registered (one line)."""


@dataclass(frozen=True)
class ActionExtension:
    name: str
    fn: Callable[..., Any] = field(repr=False)  # the action: a generator fn(ctx, reqs)
    doc: str


_actions: Dict[str, ActionExtension] = {}  # windows and invariants: in check_registry
_loaded: List[str] = []  # specs loaded in this process, in order
_registered: set = set()  # extension windows put in the window table by register_windows


def _doc(fn: Callable) -> str:
    return (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""


def _claim(f: Callable, kind: str) -> None:
    """``f``'s name is free, or taken by this same function: its module
    imported again (a scenario file that is also the extension module is
    imported by the script loader too), which re-registers it."""
    for other_kind, table in (("window", check_registry.extension_windows()),
                              ("invariant", check_registry.extension_checks()), ("action", _actions)):
        taken = table.get(f.__name__)
        if taken is None:
            continue
        fn = _user_function(taken)
        same = other_kind == kind and getattr(fn, "__code__", None) is not None and \
            (fn.__code__.co_filename, fn.__qualname__) == (f.__code__.co_filename, f.__qualname__)
        if not same:
            raise ExtensionError(f"extension {kind} {f.__name__!r}: the name is already an extension {other_kind}")


def _user_function(entry: Any) -> Callable:
    """The function a user registered, behind a registry entry."""
    if isinstance(entry, check_registry.Window):
        return entry.predicate
    if isinstance(entry, check_registry.Check):
        return entry.run.__wrapped__  # as_check wraps it
    return entry.fn


def as_check(f: Callable[[Any], Optional[str]]) -> check_registry.Run:
    """The user's invariant ``f(view) -> message or None`` as a check
    ``run(view, memory) -> Optional[Violation]`` (named as ``f``)."""
    name = f.__name__

    @functools.wraps(f)
    def run(view: Any, memory: Any) -> Optional[check_registry.Violation]:
        message = f(view)
        return check_registry.Violation(name, str(message)) if message else None

    return run


def window(fn: Optional[Callable] = None, *, loops: Sequence[str] = ALL_LOOPS, source: str = "extension",
           doc: str = ""):
    """Register ``fn(scheduler) -> Optional[str]`` as a window."""
    bad = [loop for loop in loops if loop not in ALL_LOOPS]
    if bad:
        raise ExtensionError(f"extension window: unknown loop kind(s) {bad}; known: {', '.join(ALL_LOOPS)}")

    def add(f: Callable) -> None:
        check_registry.register_window(check_registry.Window(f.__name__, tuple(loops), source, doc or _doc(f), f),
                                       extension=True)

    return _registrar(fn, "window", add)


def invariant(fn: Optional[Callable] = None, *, doc: str = ""):
    """Register ``fn(view) -> Optional[str]`` (a message when broken) as an invariant."""

    def add(f: Callable) -> None:
        check_registry.register(check_registry.Check(f.__name__, "extension", doc or _doc(f), as_check(f)))

    return _registrar(fn, "invariant", add)


def action(fn: Optional[Callable] = None, *, doc: str = ""):
    """Register the generator ``fn(ctx, reqs)`` as an explorer action."""

    def add(f: Callable) -> None:
        _actions[f.__name__] = ActionExtension(f.__name__, f, doc or _doc(f))

    return _registrar(fn, "action", add)


def _registrar(fn: Optional[Callable], kind: str, add: Callable[[Callable], Any]):
    """The decorator (used bare, ``@ext.window``, or called, ``@ext.window(...)``)
    that checks ``f``'s name is free and registers it with ``add(f)``."""

    def register(f: Callable) -> Callable:
        _claim(f, kind)
        add(f)
        return f

    return register(fn) if fn is not None else register


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

    for ext in check_registry.extension_windows().values():
        if ext.name in window_table.BUILTIN and ext.name not in _registered:
            raise ExtensionError(f"extension window {ext.name!r}: a built-in window has that name")
        window_table.WINDOWS[ext.name] = ext
        _registered.add(ext.name)



def activate(specs: Iterable[str]) -> None:
    """Load ``specs`` in this (harness) process and register their windows:
    what ``--extension`` does before anything starts."""
    load(specs)
    register_windows()


def summary() -> Dict[str, List[str]]:
    """What is loaded, by kind (the server's info and ``run`` print it)."""
    return {"windows": sorted(check_registry.extension_windows()),
            "invariants": sorted(check_registry.extension_checks()), "actions": sorted(_actions)}


def loaded_line(info: Dict[str, Any]) -> Optional[str]:
    """``extensions loaded in the scheduler: ...`` from a server's info (its
    rank's ``summary``), or None when it loaded none."""
    loaded = info.get("extensions") or {}
    if not any(loaded.values()):
        return None
    return "extensions loaded in the scheduler: " + "; ".join(
        f"{kind} {', '.join(names)}" for kind, names in loaded.items() if names)
