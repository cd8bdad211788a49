"""The types every patch module shares (fix toggles, mutants, a user's own):
kept apart from ``patches.py`` so those modules can import them without a
cycle through the registry."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Tuple, TypeVar

ALL_TOPOLOGIES = ("pp1-overlap", "pp1-normal", "pp4", "pp1-hicache", "pp1-lora", "pp1-priority")  # engine_config.ALL_TOPOLOGIES


class PatchError(RuntimeError):
    """A patch does not apply to the installed SGLang (or cannot be found)."""


@dataclass(frozen=True)
class Patch:
    """A named patch. ``install`` receives the imported scheduler module
    (``sglang.srt.managers.scheduler``) and patches whatever it needs.

    ``topologies``: where its effect can be seen at all (a mutant of the PP
    loop is invisible at pp=1); ``unreachable_on``: ``DEVICE:TOPOLOGY``
    pairs of those where the code it breaks cannot run (the harness refuses
    the operation there, measured, e.g. ``cpu:pp4``); ``expected``: which
    check should see it."""

    name: str
    summary: str
    install: Callable[[Any], None]
    topologies: Tuple[str, ...] = ALL_TOPOLOGIES
    expected: str = ""
    unreachable_on: Tuple[str, ...] = ()

    def applies(self, topology: str, device: str = "cpu") -> bool:
        """Whether its effect can be seen on ``topology`` with ``device``."""
        return topology in self.topologies and f"{device}:{topology}" not in self.unreachable_on



Entry = TypeVar("Entry")  # a Patch or a FixToggle: anything with a ``name``
Install = Callable[[Any], None]


def declaring(table: Dict[str, Entry], make: Callable[[Install], Entry]) -> Callable[[Install], Install]:
    """The decorator that declares a built-in patch next to its install
    function: it adds ``make(install)`` to ``table`` (the kind's registry,
    in declaration order) and returns the function unchanged. A name is
    declared once. Used by ``mutants.base.mutant`` and
    ``fix_toggles.fix_toggle``."""

    def declare(install: Install) -> Install:
        entry = make(install)
        if entry.name in table:
            raise PatchError(f"patch {entry.name!r} is declared twice")
        table[entry.name] = entry
        return install

    return declare
