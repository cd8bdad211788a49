"""``ExploreSettings``: how one exploration searches, as one frozen value
(harness process). Which server it explores is the other value,
``server_config.ServerConfig``; ``explorer.explore(config, settings)``
takes both.

Budget: ``profile`` (``search.PROFILES``), and ``max_examples``,
``max_time_s``, ``shrink_time_s`` to override it; ``seed`` (None: the
profile's, chosen at random unless derandomized). What runs first:
``corpus`` (the seed corpus), ``database`` (the failure database:
``failure_db.open_database``'s SPEC; this value's default is ``none``, the
command's ``OUT/failure-db``) and ``database_read_only``. What a failure
does: ``known_bugs`` (the registry to match against; None: the built-in
one, ``()``: every failure is new) and ``stop_at_known``; ``waive_known``
(the check a registered bug breaks on nearly every program is off where
it applies, ``KnownBug.masks_check``);
``fresh_replay`` (the written file is replayed on a fresh server, else on
the explorer's own); ``check_determinism``. How it searches: ``novelty``
(guided by the abstract states programs reach, ``novelty.py``; off, the
states are still counted; None, the profile's: ``guided``). The servers: ``standby``
(``auto``/``on``/``off``), ``start_timeout_s``, ``example_timeout_s``,
``log_dir``. Labels for what is written: ``found_by`` (the command, for the
file's header), ``sglang_spec`` (the build SPEC this process explores, for
the replay command). ``stop_file``: workers stop searching once it exists.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional, Sequence

FOUND_BY = "`scripted-runtime explore`"


@dataclass(frozen=True)
class ExploreSettings:
    profile: str = "ci"
    max_examples: Optional[int] = None
    max_time_s: Optional[float] = None
    shrink_time_s: Optional[float] = None
    seed: Optional[int] = None
    corpus: bool = True
    novelty: Optional[bool] = None  # None: the profile's (search.PROFILES: off for ci, on for dev, nightly)
    database: Optional[str] = "none"
    database_read_only: bool = False
    known_bugs: Optional[Sequence[Any]] = None
    stop_at_known: bool = False
    fresh_replay: bool = True
    check_determinism: bool = True
    standby: str = "auto"
    start_timeout_s: float = 300.0
    example_timeout_s: float = 120.0
    log_dir: Optional[Path] = None
    found_by: str = FOUND_BY
    sglang_spec: Optional[str] = None
    stop_file: Optional[str] = None
    fuzz_requests: bool = False  # draw FuzzRequest/AbortUnknown (request_fuzz's field cases)
    fuzz_known_crashes: bool = False  # ... those meeting a known server-killing bug too
    # turn off the check a registered bug breaks on nearly every program where it applies
    # (``known_bugs.KnownBug.masks_check``), so programs go on past it
    waive_known: bool = True

    def guided(self, profile: Any) -> bool:
        """Whether the search is guided by novelty: ``novelty`` where the run
        says, else ``profile``'s (a ``search.Profile``)."""
        return bool(profile.novelty) if self.novelty is None else bool(self.novelty)

    def search_time_s(self, profile: Any, topology: Optional[str]) -> float:
        """The search's time on ``topology``: ``max_time_s`` where the run
        gives it, else ``profile``'s (a ``search.Profile``, scaled per topology)."""
        return profile.search_time_s(topology, given=self.max_time_s)

    def __post_init__(self) -> None:
        if self.known_bugs is not None:
            object.__setattr__(self, "known_bugs", tuple(self.known_bugs))

    def replace(self, **changes: Any) -> "ExploreSettings":
        return replace(self, **changes)

    def registry(self) -> Sequence[Any]:
        """The known-bug registry failures are matched against."""
        if self.known_bugs is not None:
            return self.known_bugs
        from scripted_runtime import known_bugs

        return known_bugs.REGISTRY
