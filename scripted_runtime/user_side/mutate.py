"""The kill table: how many planted bugs (mutants) a bounded exploration
finds, on which topology, how fast, and with which check.

Per topology: first the unmutated build with the same budget (it must find
nothing, else the table is void: a failure there would be counted as a kill
of every mutant), then one exploration per mutant that applies to that
topology, each on its own server (patches are applied at import time in
every scheduler rank). A mutant is *killed* when the exploration reports a
failure; the time to kill is counted from server ready, like the explorer's
own first-failure time.
"""
from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from scripted_runtime.hooks import mutants as builtin_mutants
from scripted_runtime.hooks import patches as patch_specs
from scripted_runtime.user_side.explore.explore_settings import ExploreSettings
from scripted_runtime.user_side.server_config import ServerConfig

BASELINE = "(unmutated)"


@dataclass
class KillRow:
    topology: str
    mutant: str
    status: str  # killed | survived | killed-at-start | FAILED (baseline) | clean (baseline)
    seconds_to_kill: Optional[float] = None  # from server ready
    programs: Optional[int] = None  # programs run up to the first failure (or all, if none failed)
    signature: str = ""
    caught_by: str = ""
    expected: str = ""
    scenario: Optional[str] = None
    replays: Optional[bool] = None  # the kill's written file, run once more, failed the same way
    wall_s: float = 0.0
    # the workarounds of registered bugs its servers ran with (explore's ``worked_around``: patch names)
    worked_around: Tuple[str, ...] = ()

    @property
    def killed(self) -> bool:
        return self.status.startswith("killed")


def caught_by(signature: str) -> str:
    """Which check a failure signature comes from."""
    m = re.match(r"(Invariant|Contract)Violation\[(\w+)\]", signature)
    if m:
        return f"{m.group(1).lower()} {m.group(2)}"
    if signature.startswith("OutputMismatch"):
        return "output oracle"
    if signature.startswith("SchedulerCrashed"):
        return "crash"
    if signature.startswith(("EndStateError", "UpdateAnswerTimeout")):
        return "end-state check"
    if signature.startswith("RequestContractError"):
        return "request contract"
    if signature.startswith("AnswerDeliveryError"):
        return "answer delivery"
    if signature.startswith("LogprobContractError"):
        return "logprob contract"
    if signature.startswith("WeightVersionError"):
        return "weight-version contract"
    if signature.startswith("server start"):
        return "server start"
    if signature.startswith("ResetError"):
        # the reset before the next program: its fingerprint or a restore that changed nothing
        return "reset"
    return "script error" if signature else ""


def applicable(spec: str, topology: str, device: str = "cpu") -> bool:
    """Whether a mutant can be seen on a topology with ``device`` at all (its
    ``topologies`` less its ``unreachable_on``; a user's patch that declares
    none applies everywhere)."""
    try:
        patch = patch_specs.load(spec)
    except patch_specs.PatchError:
        return True
    applies = getattr(patch, "applies", None)  # a Patch: its own rule
    return applies(topology, device) if applies is not None else topology in getattr(patch, "topologies",
                                                                                          (topology,))


def expected_of(spec: str) -> str:
    try:
        return getattr(patch_specs.load(spec), "expected", "") or ""
    except patch_specs.PatchError:
        return ""


def out_dir_for(out_dir: Path, topology: str, mutant: str) -> Path:
    """Where one row's exploration writes: ``OUT/TOPOLOGY/LABEL``, the
    label a built-in's name, ``unmutated`` for the baseline, or a user's
    spec's file-name-safe label (``my_mutants.NAME``), so that even an
    absolute ``/dir/my_mutants.py:NAME`` stays under ``out_dir``."""
    return Path(out_dir) / topology / ("unmutated" if mutant == BASELINE else patch_specs.label(mutant))


SETTINGS = ExploreSettings(profile="ci", shrink_time_s=20.0)  # the command's defaults
# How many left-out mutants the progress line names (the rest are counted)
LEFT_OUT_NAMED = 5


def run_table(config: ServerConfig = ServerConfig(), settings: ExploreSettings = SETTINGS, *,
              topologies: Sequence[str], mutants: Sequence[str], out_dir: Path = Path("mutate-found"),
              progress: Callable[[str], None] = print,
              explore_fn: Optional[Callable[..., Any]] = None) -> List[KillRow]:
    """One exploration per row, each of ``config`` on that row's topology
    with that row's mutant as its only patch, with ``settings`` (no
    determinism check: a row asks only whether the mutant is found)."""
    from scripted_runtime.errors import ServerStartError
    from scripted_runtime.user_side.explore import explorer

    explore_fn = explore_fn or explorer.explore
    rows: List[KillRow] = []
    plan = [(t, m) for t in topologies for m in [BASELINE, *[m for m in mutants if applicable(m, t, config.device)]]]
    for t in topologies:  # say so, rather than leave a row out silently (a --patch on a feature topology)
        left_out = [m for m in mutants if not applicable(m, t, config.device)]
        if left_out:
            names = ", ".join(left_out[:LEFT_OUT_NAMED]) + (f" and {len(left_out) - LEFT_OUT_NAMED} more"
                                                            if len(left_out) > LEFT_OUT_NAMED else "")
            progress(f"[mutate] {len(left_out)} mutant(s) left out on {t} ({config.device}): their topologies "
                     f"do not name it, or the code they break cannot run there: {names}")
    t_start = time.monotonic()
    for i, (topology, mutant) in enumerate(plan, 1):
        label = f"[mutate {i}/{len(plan)} {topology} {mutant}]"
        progress(f"{label} exploring ({settings.profile} profile); {time.monotonic() - t_start:.0f}s elapsed")
        t0 = time.monotonic()
        patches = [] if mutant == BASELINE else [mutant]
        row = KillRow(topology=topology, mutant=mutant, status="", expected=expected_of(mutant) if patches else "")
        try:
            report = explore_fn(
                config.replace(topology=topology, patches=tuple(patches)),
                settings.replace(check_determinism=False,
                                 found_by=f"`scripted-runtime mutate` ({mutant} on {topology})"),
                out_dir=out_dir_for(out_dir, topology, mutant),
                progress=lambda line: progress(f"{label} {line}"))
        except ServerStartError as exc:
            first = next((ln for ln in str(exc).splitlines() if ln.strip()), "")
            row.status = "FAILED" if not patches else "killed-at-start"
            row.signature = f"server start: {first[:200]}"
            row.caught_by = caught_by(row.signature)
        else:
            stats = report.stats
            row.worked_around = tuple(getattr(report, "worked_around", None) or ())
            if report.failed:
                row.status = "FAILED" if not patches else "killed"
                row.signature = report.signature or ""
                row.caught_by = caught_by(row.signature)
                row.seconds_to_kill = report.first_failure_s
                row.programs = report.found_after_examples
                row.scenario = report.scenario_path
                row.replays = report.replay_matches
            else:
                row.status = "clean" if not patches else "survived"
                row.programs = stats.examples
        row.wall_s = time.monotonic() - t0
        rows.append(row)
        progress(f"{label} {row.status}" + (f": {row.signature} after {row.programs} programs, "
                                            f"{row.seconds_to_kill or 0:.1f}s" if row.killed else ""))
    return rows


def void_topologies(rows: Sequence[KillRow]) -> List[str]:
    return sorted({r.topology for r in rows if r.mutant == BASELINE and r.status != "clean"})


def summary(rows: Sequence[KillRow]) -> Dict[str, Any]:
    muts = [r for r in rows if r.mutant != BASELINE]
    killed = [r for r in muts if r.killed]
    times = sorted(r.seconds_to_kill for r in killed if r.seconds_to_kill is not None)
    median = None
    if times:
        mid = len(times) // 2
        median = times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2
    # a kill whose written file, run again on a fresh server, did not fail the same way: a failure
    # that does not replay is not a proven kill (reported beside the rate, never hidden in it)
    unreplayed = [r.mutant for r in killed if r.replays is False]
    return {"mutant_runs": len(muts), "killed": len(killed),
            "kill_rate": (len(killed) / len(muts)) if muts else None,
            "killed_replaying": len(killed) - len(unreplayed), "unreplayed": unreplayed,
            "median_seconds_to_kill": median, "void": void_topologies(rows)}


def format_table(rows: Sequence[KillRow], width: int = 70) -> str:
    header = ["topology", "mutant", "result", "to kill (s)", "programs", "caught by", "replays", "signature",
              "expected / note"]
    body = []
    for r in rows:
        sig = r.signature if len(r.signature) <= width else r.signature[: width - 3] + "..."
        body.append([r.topology, r.mutant, r.status,
                     f"{r.seconds_to_kill:.1f}" if r.seconds_to_kill is not None else "-",
                     str(r.programs) if r.programs is not None else "-",
                     r.caught_by or "-", {True: "yes", False: "NO"}.get(r.replays, "-"), sig or "-",
                     r.expected or "-"])
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
    lines = [" | ".join(h.ljust(w) for h, w in zip(header, widths)),
             "-+-".join("-" * w for w in widths)]
    lines += [" | ".join(c.ljust(w) for c, w in zip(row, widths)) for row in body]
    s = summary(rows)
    if s["mutant_runs"]:
        med = f"{s['median_seconds_to_kill']:.1f}s" if s["median_seconds_to_kill"] is not None else "-"
        lines.append(f"\nkilled {s['killed']} of {s['mutant_runs']} mutant runs "
                     f"({100 * s['kill_rate']:.0f}%); median time to kill {med} from server ready")
        if s["unreplayed"]:
            n = len(s["unreplayed"])
            lines.append(f"{n} kill{'s' if n > 1 else ''} did NOT replay on a fresh server "
                         f"({', '.join(s['unreplayed'])}): {s['killed_replaying']} of {s['mutant_runs']} "
                         f"({100 * s['killed_replaying'] / s['mutant_runs']:.0f}%) killed by a failure that replays")
    if s["void"]:
        lines.append(f"VOID on {', '.join(s['void'])}: the unmutated build failed with the same budget, "
                     "so a failure there says nothing about a mutant")
    return "\n".join(lines)


def as_json(rows: Sequence[KillRow]) -> Dict[str, Any]:
    return {"rows": [asdict(r) for r in rows], "summary": summary(rows)}


def default_mutants() -> List[str]:
    return list(builtin_mutants.MUTANTS)
