"""The one registry of checks and windows, built-in and extension alike.

A check is registered by a decorator next to its code, and a user's
extension (``scripted_runtime/extensions.py``) registers the same way:

* ``@invariant(NAME, doc=...)`` and ``@invariant(NAME, group="hicache")``
  (``invariants.py``, ``hicache_checks.py``), ``@contract(*NAMES)``
  (``contracts.py``): per-iteration checks ``run(view, memory) ->
  Optional[Violation]`` over the iteration's ``StateView`` and the run's
  ``InvariantMemory``. One ``run`` may serve several names (the contracts are
  checked together): it runs once an iteration when any of its names is on.
* ``@end_check(NAME)`` (``output_oracle.py``, ``request_contract.py``,
  ``answer_delivery.py``):
  checked once, at a program's end-state check, switched on and off by name
  like the others; they fail the program with their own error
  (``OutputMismatch``, ``RequestContractError``, ``AnswerDeliveryError``), as the failure signatures
  the kill table and the known-bug registry match have always named them.
* ``@window(NAME, loops=..., source=..., doc=...)`` (``windows.py``): a
  predicate over the scheduler, evaluated each iteration.

Every per-iteration check reports a ``Violation`` (its name, message and
the requests involved). Checks are listed and run group by group (``GROUPS``), each group
in the order it was registered; extension checks come last. Plain Python: it
imports nothing of SGLang and is loaded in the harness and in every
scheduler rank.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

# The groups of checks, in the order they are listed and run.
GROUPS = ("invariant", "hicache", "contract", "end_check", "extension")


def kind_of(name: str) -> str:
    """``ContractViolation`` for a contract's name, else ``InvariantViolation``."""
    check = _builtin.get(name)
    return "ContractViolation" if check is not None and check.group == "contract" else "InvariantViolation"


@dataclass
class Violation:
    """What every check reports: the check's ``name``, a ``message``, and the
    requests involved (``owners``: rid -> {"row": ..., "holders": [...]});
    ``step`` and ``iteration`` are filled in where the run noticed it."""

    name: str
    message: str
    owners: Dict[str, Any] = field(default_factory=dict)
    iteration: Optional[int] = None
    step: Optional[int] = None

    @property
    def invariant(self) -> str:
        """The check's name, under the key results and traces have always used."""
        return self.name

    @property
    def kind(self) -> str:
        return kind_of(self.name)

    def headline(self) -> str:
        where = f" at step {self.step}" if self.step is not None else ""
        return f"{self.kind}[{self.name}]{where}: {self.message}"

    def as_dict(self) -> Dict[str, Any]:
        return {"invariant": self.name, "kind": self.kind, "message": self.message, "owners": self.owners,
                "iteration": self.iteration, "step": self.step}


Run = Callable[[Any, Any], Optional[Violation]]  # run(view, memory)


@dataclass(frozen=True)
class Check:
    name: str
    group: str  # one of GROUPS
    doc: str
    run: Optional[Run] = field(default=None, repr=False, compare=False)  # None: an end check (run elsewhere)


Predicate = Callable[[Any], Optional[str]]


@dataclass(frozen=True)
class Window:
    name: str
    loops: Tuple[str, ...]  # loop kinds where it can open: "normal", "overlap", "pp"
    source: str  # the SGLang issue / PR it comes from
    doc: str
    predicate: Predicate = field(repr=False, compare=False)
    needs: str = ""  # an engine feature it can only open with ("hicache"); the explorer draws it only then


_builtin: Dict[str, Check] = {}
_builtin_order: List[Check] = []  # _builtin group by group, rebuilt when a built-in check registers
_extension_checks: Dict[str, Check] = {}
_builtin_windows: Dict[str, Window] = {}
_extension_windows: Dict[str, Window] = {}
_version = 0  # bumped by every registration of a check: what a cached list of checks is built from


def version() -> Tuple[int, int, int]:
    """Changes whenever a check registers (built-in or extension) or the
    extension table is replaced (tests swap in an empty one)."""
    return _version, id(_extension_checks), len(_extension_checks)


def register(check: Check) -> Check:
    """Add ``check`` (group ``extension``: a user's, else a built-in one)."""
    global _version
    if check.group not in GROUPS:
        raise ValueError(f"check {check.name!r}: unknown group {check.group!r}; known: {', '.join(GROUPS)}")
    _version += 1
    if check.group == "extension":
        _extension_checks[check.name] = check
        return check
    _builtin[check.name] = check
    order = {group: i for i, group in enumerate(GROUPS)}
    # stable: registration order within a group
    _builtin_order[:] = sorted(_builtin.values(), key=lambda c: order[c.group])
    return check


def register_window(window: Window, *, extension: bool = False) -> Window:
    (_extension_windows if extension else _builtin_windows)[window.name] = window
    return window


def invariant(name: str, *, doc: str, group: str = "invariant"):
    """Register ``run(view, memory) -> Optional[Violation]`` as the check ``name``."""

    def add(run: Run) -> Run:
        register(Check(name, group, doc, run))
        return run

    return add


def contract(*names: str, docs: Dict[str, str]):
    """Register one ``run(view, memory)`` as the contracts ``names`` (checked together)."""

    def add(run: Run) -> Run:
        for name in names:
            register(Check(name, "contract", docs[name], run))
        return run

    return add


def end_check(name: str, *, doc: str):
    """Register ``name`` as a check made once, at a program's end (by the function decorated)."""

    def add(fn: Callable) -> Callable:
        register(Check(name, "end_check", doc))
        return fn

    return add


def window(name: str, *, loops: Tuple[str, ...], source: str, doc: str, needs: str = ""):
    """Register ``predicate(scheduler) -> Optional[str]`` as the built-in window ``name``."""

    def add(predicate: Predicate) -> Predicate:
        register_window(Window(name, tuple(loops), source, doc, predicate, needs))
        return predicate

    return add


def builtin_checks() -> List[Check]:
    """The built-in checks registered so far, group by group."""
    return list(_builtin_order)


def extension_checks() -> Dict[str, Check]:
    return dict(_extension_checks)


def names(*groups: str) -> Tuple[str, ...]:
    """The built-in checks' names (of ``groups``, or all), in order."""
    return tuple(c.name for c in builtin_checks() if not groups or c.group in groups)


def builtin_windows() -> Dict[str, Window]:
    return dict(_builtin_windows)


def extension_windows() -> Dict[str, Window]:
    return dict(_extension_windows)
