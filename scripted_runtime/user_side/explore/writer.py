"""Writes a failing program out as a plain, runnable scenario file."""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from scripted_runtime.user_side.server_config import ServerConfig
from scripted_runtime.user_side.explore import actions as A


def replay_command(path: str, config: ServerConfig, *, sglang: Optional[str] = None) -> str:
    """The command that replays the scenario at ``path`` on ``config``'s
    server (``ServerConfig.as_cli_args``): ``run``, or ``bisect-check`` on
    another build ``sglang`` (which names the build, so no fix or patch
    options)."""
    if sglang and sglang != "current":
        return (f"scripted-runtime bisect-check {path}:{A.PROGRAM_FUNCTION} --sglang {sglang}"
                f"{config.as_cli_args(build_options=False)}")
    return f"scripted-runtime run {path}:{A.PROGRAM_FUNCTION}{config.as_cli_args()}"


def write_scenario(out_dir: Path, program: Sequence[A.Action], outcome, *, config: ServerConfig,
                   sglang_version: str, seed: Optional[int], profile: str, sglang_spec: Optional[str] = None,
                   found_after: str = "", shrunk: bool = True, found_by: str = "`scripted-runtime explore`",
                   earlier: Sequence[Sequence[A.Action]] = (), history_note: str = "") -> Path:
    """``shrunk``: the program is Hypothesis's shrunk form (else as first
    found). ``found_by``: the command that met it, for the header.
    ``earlier``: programs the failure needs to have run before it on the
    same server (``history.recover``); the file then lists them in
    ``RUNS_BEFORE``, so every replay runs them first. ``history_note``:
    how the history was shrunk; without ``earlier``, how the program was
    (``history.recover`` found it needs no history)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9]+", "_", outcome.signature).strip("_").lower()[:40]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    topology, revert_fixes, patches = config.topology, config.revert_fixes, config.patches
    base = f"found_{topology.replace('-', '_')}_{slug}_{stamp}"
    path = out_dir / f"{base}.py"
    n = 1
    while path.exists():  # two failures written in the same second: never overwrite one
        n += 1
        path = out_dir / f"{base}_{n}.py"
    where = (f"action {outcome.failing_action + 1}" if outcome.failing_action is not None
             else "the end-state checks")
    build = f"SGLang {sglang_version}" + (f" with fixes reverted: {', '.join(revert_fixes)}" if revert_fixes else "")
    build += f" with patches: {', '.join(patches)}" if patches else ""
    build += "" if config.checks else " (invariants off)"
    lines: List[str] = [
        f"Found by {found_by} ({profile} profile, seed {seed if seed is not None else 'derandomized'})",
        f"on {build}, topology {topology}{(', ' + found_after) if found_after else ''}.",
        "",
        f"Failure: {outcome.signature}",
        f"  {outcome.message[:400]}",
        f"It fails in {where}" + (f", at script step {outcome.failing_step}" if outcome.failing_step is not None
                                  else "") + " (marked below).",
        "",
        "Replay:",
        f"  {replay_command(str(path), config, sglang=sglang_spec)}",
        "",
    ]
    if earlier:
        lines += [
            f"It needs a history: on a fresh server it fails only after {len(earlier)} earlier program"
            f"{'s' if len(earlier) > 1 else ''}",
            f"ran on the same server ({history_note}).",
            "RUNS_BEFORE, at the end of this file, lists them: `scripted-runtime run` and the explorer run",
            "them first, in order, each after the usual engine reset, then `program`. What they leave",
            "behind that the reset does not clear is the lead.",
            "",
        ]
        for k, prior in enumerate(earlier, 1):
            lines.append(f"earlier_{k}:")
            lines += [f"  {i + 1}. {text}" for i, text in enumerate(A.describe_program(prior))] or ["  (no actions)"]
        lines.append("")
    lines.append(("The failing program, shrunk after them on fresh servers" if shrunk and earlier else
                  f"The program, {history_note}" if history_note else
                  "The program, shrunk by Hypothesis" if shrunk else "The program as it was first found (not shrunk)")
                 + " (one `yield` = one scheduler iteration):")
    lines += [f"  {i + 1}. {text}" for i, text in enumerate(A.describe_program(program))]
    mark: Dict[int, str] = {}
    key = outcome.failing_action if outcome.failing_action is not None else -1
    step = f" (step {outcome.failing_step})" if outcome.failing_step is not None else ""
    mark[key] = f"FAILS here{step}: {outcome.signature}"
    text = A.to_source(program, docstring="\n".join(lines), mark=mark).text
    for k, prior in enumerate(earlier, 1):
        prior_text = A.to_source(prior, function=f"earlier_{k}").text
        text += "\n\n" + prior_text[prior_text.index(f"def earlier_{k}("):]
    if earlier:
        names = ", ".join(repr(f"earlier_{k}") for k in range(1, len(earlier) + 1))
        text += ("\n\n# Run, in order and each after the engine reset, on the same server before `program`.\n"
                 f"RUNS_BEFORE = {{{A.PROGRAM_FUNCTION!r}: [{names}]}}\n")
    path.write_text(text)
    return path


def write_kept(out_dir: Path, program: Sequence[A.Action], outcome, *, position: int, run: str,
               known_name: str = "", **scenario) -> Path:
    """The first program of a failure, as found (not shrunk), written the
    moment it was met: program ``position`` of ``run`` (e.g. "the run (ci
    profile, seed 7)"). ``scenario``: ``write_scenario``'s other arguments."""
    note = f"; known SGLang bug {known_name}" if known_name else ""
    return write_scenario(out_dir, program, outcome, shrunk=False,
                          found_after=f"program {position} of {run}{note}", **scenario)
