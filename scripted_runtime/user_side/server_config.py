"""``ServerConfig``: which server you get, as one frozen value (harness process).

Identity (what a started server is, and so what ``key()`` covers): the
device, the topology, the engine overrides (SGLang ``ServerArgs`` fields on
top of the topology's), the SGLang fixes reverted in-process, the patches
and the extensions loaded in every rank. ``checks`` (which invariants a run
checks) travels with it, since every command that starts a server also
judges runs on it and the written scenario's replay command names it, but
it is applied per run, not at start, so it is not part of ``key()``.

Not here, because they change how a server is started or watched, never
which one: the start timeout, the log directory, the script timeout (the
callers' run settings). Nor the SGLang build: a server always runs the
SGLang of the interpreter that starts it.

``ScriptedServer.start``, ``ServerPool.get``, the pytest marker, the command
line (``cli.server_config``: one helper for run, explore, mutate, ab and
bisect-check), ``explore``, ``mutate``, the failure database's key and the
written scenario file all take it."""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, replace
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

Checks = Union[bool, Tuple[str, ...]]


def _pairs(overrides: Union[None, Mapping[str, Any], Iterable[Tuple[str, Any]]]) -> Tuple[Tuple[str, Any], ...]:
    items = dict(overrides.items() if isinstance(overrides, Mapping) else (overrides or ()))
    return tuple(sorted(items.items()))


def _checks(checks: Any) -> Checks:
    """True (every invariant), False (none) or the names checked; an empty
    selection is False (it checks none, as ``server.run`` reads it)."""
    if checks is True or checks is False:
        return checks
    if checks is None:
        return False
    if isinstance(checks, str):
        raise TypeError(f"ServerConfig.checks: True, False or a collection of check names, not the string {checks!r}")
    names = tuple(checks)
    return names if names else False


@dataclass(frozen=True)
class ServerConfig:
    topology: str = "pp1-overlap"
    device: str = "cpu"
    # sorted (name, value) pairs; the constructor takes a dict too
    engine_overrides: Tuple[Tuple[str, Any], ...] = ()
    revert_fixes: Tuple[str, ...] = ()
    patches: Tuple[str, ...] = ()
    extensions: Tuple[str, ...] = ()
    # True: every invariant; False: none; a tuple: the names checked (``ScriptedServer.run``'s ``invariants``)
    checks: Checks = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "engine_overrides", _pairs(self.engine_overrides))
        for name in ("revert_fixes", "patches", "extensions"):
            value = getattr(self, name)
            object.__setattr__(self, name, (value,) if isinstance(value, str) else tuple(value or ()))
        object.__setattr__(self, "checks", _checks(self.checks))

    # --- derived ------------------------------------------------------------
    @property
    def overrides(self) -> Dict[str, Any]:
        """The engine overrides as a dict (a copy)."""
        return dict(self.engine_overrides)

    def replace(self, **changes: Any) -> "ServerConfig":
        return replace(self, **changes)

    def engine_kwargs(self) -> Dict[str, Any]:
        """Full engine kwargs (``engine_config.engine_kwargs``): a
        ValueError for a device, topology or combination that cannot run."""
        from scripted_runtime.user_side import engine_config

        return engine_config.engine_kwargs(self.device, self.topology, **self.overrides)

    def features(self) -> Tuple[str, ...]:
        """The engine features on, as the explorer's windows and actions name them."""
        from scripted_runtime.user_side import engine_config

        return engine_config.features_of(self.topology, self.overrides)

    # --- validation ---------------------------------------------------------
    def validate(self) -> "ServerConfig":
        """Everything that can be known wrong before a server starts, in
        this process, as a ValueError naming it: the engine arguments, the
        fix toggles, the patches (checked, not imported) and the extensions
        (loaded here: their invariants' names are then valid, their actions
        drawable), then the checked invariants' names. Returns ``self``."""
        self.engine_kwargs()
        self.resolved_revert_fixes()
        self.resolved_patches()
        self.resolved_extensions()
        if not isinstance(self.checks, bool):
            from scripted_runtime.scheduler_side import invariants

            invariants.validate_names(list(self.checks))
        return self

    def resolved_revert_fixes(self) -> List[str]:
        from scripted_runtime.hooks import fix_toggles

        return fix_toggles.validate(list(self.revert_fixes))

    def resolved_patches(self) -> List[Any]:
        """``patches.check`` of each (spec, search path), nothing imported."""
        from scripted_runtime.hooks import patches as patch_specs

        return [patch_specs.check(p) for p in self.patches]

    def resolved_extensions(self) -> List[Tuple[str, Optional[str]]]:
        """``extensions.resolve`` of each (spec for the ranks, PYTHONPATH
        entry), loaded in this process too (``extensions.activate``)."""
        from scripted_runtime import extensions as extension_points

        specs = [extension_points.resolve(e) for e in self.extensions]
        extension_points.activate(spec for spec, _ in specs)
        return specs

    # --- identity -----------------------------------------------------------
    def key(self) -> str:
        """A stable text key of the server's identity (every field but
        ``checks``): equal for configurations that start the same server,
        the same in every process (the pool's key)."""
        return json.dumps({"device": self.device, "topology": self.topology,
                           "engine": [[k, v] for k, v in self.engine_overrides],
                           "revert_fixes": list(self.revert_fixes), "patches": list(self.patches),
                           "extensions": list(self.extensions)}, sort_keys=True, default=str)

    # --- printing -----------------------------------------------------------
    def describe(self) -> str:
        """One line for progress output: the topology, then what differs
        from a plain server, as the command-line flags that ask for it."""
        return self.topology + "".join(f" --revert-fix {f}" for f in self.revert_fixes) + "".join(
            f" --patch {p}" for p in self.patches) + "".join(f" --extension {e}" for e in self.extensions) + "".join(
            f" {k}={v}" for k, v in self.engine_overrides)

    def as_argv(self, *, build_options: bool = True) -> List[str]:
        """The ``scripted-runtime run`` options that start this server and
        check what it checks (["--no-overlap", ...]; [] for the default).
        ``build_options`` False leaves out the reverted fixes and patches
        (``bisect-check`` names the build in its SPEC instead)."""
        from scripted_runtime.user_side import engine_config

        argv = shlex.split(engine_config.run_options(self.topology))
        for k, v in self.engine_overrides:
            argv += ["--sglang-arg", f"{k}={_cli_value(v)}"]
        if self.device != "cpu":
            argv += ["--device", self.device]
        argv += self._checks_argv()
        for e in self.extensions:
            argv += ["--extension", e]
        if build_options:
            for f in self.revert_fixes:
                argv += ["--revert-fix", f]
            for p in self.patches:
                argv += ["--patch", p]
        return argv

    def as_cli_args(self, *, build_options: bool = True) -> str:
        """``as_argv`` as command-line text (" --no-overlap ..."; "" for the
        default), as the written scenario's replay command gives it."""
        return "".join(" " + shlex.quote(a) for a in self.as_argv(build_options=build_options))

    def _checks_argv(self) -> List[str]:
        if self.checks is True:
            return []
        if self.checks is False:
            return ["--no-invariants"]
        from scripted_runtime.scheduler_side import invariants

        return [a for n in invariants.all_names() if n not in self.checks for a in ("--skip-invariant", n)]

    def pp_size(self) -> int:
        from scripted_runtime.user_side import engine_config

        return int({**engine_config.ALL_TOPOLOGIES.get(self.topology, {}), **self.overrides}.get("pp_size", 1) or 1)


def _cli_value(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
