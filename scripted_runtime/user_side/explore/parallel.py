"""Exploration in child processes: on another SGLang build (``--sglang``),
and with several workers (``-n``), each with its own server.

Workers search with different seeds (worker i of a derandomized ``ci`` run
uses seed i, so they do not repeat each other), split the example budget,
and share a stop file: the first worker to find a failure creates it and the
others stop searching. The parent merges their statistics.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import List

from scripted_runtime.errors import UsageError
from scripted_runtime.user_side.builds import side
from scripted_runtime.user_side.explore.stats import Stats, merge_all

EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
GRACE_S = 600.0  # beyond the search and shrink budgets: server start, determinism check, replay


def explore_argv(args: argparse.Namespace, **override) -> List[str]:
    """The ``explore`` command line that re-creates ``args`` (with overrides)."""
    values = dict(vars(args))
    values.update(override)
    argv = ["explore", "--pp", str(values["pp"]), "--overlap" if values["overlap"] else "--no-overlap",
            "--device", values["device"], "--profile", values["profile"], "--out", values["out"],
            "--timeout", str(values["timeout"]), "--start-timeout", str(values["start_timeout"]),
            "-n", str(values["workers"]), "--standby", values.get("standby") or "auto"]
    for flag, key in (("--max-examples", "max_examples"), ("--max-time", "max_time"),
                      ("--shrink-time", "shrink_time"), ("--seed", "seed"), ("--stats-json", "stats_json"),
                      ("--stop-file", "stop_file"), ("--worker-label", "worker_label"),
                      ("--sglang-label", "sglang_label"), ("--topology", "topology")):
        if values.get(key) is not None:
            argv += [flag, str(values[key])]
    for kv in values.get("sglang_arg") or []:
        argv += ["--sglang-arg", kv]
    for name in values.get("revert_fix") or []:
        argv += ["--revert-fix", name]
    for spec in values.get("patch") or []:
        argv += ["--patch", spec]
    for spec in values.get("extension") or []:
        argv += ["--extension", spec]
    if values.get("no_determinism_check"):
        argv.append("--no-determinism-check")
    if values.get("no_invariants"):
        argv.append("--no-invariants")
    if values.get("stop_at_known"):
        argv.append("--stop-at-known")
    if values.get("no_known_bugs"):
        argv.append("--no-known-bugs")
    if values.get("no_corpus"):
        argv.append("--no-corpus")
    if values.get("novelty") is not None:
        argv.append("--novelty" if values["novelty"] else "--no-novelty")
    if values.get("waive_known") is False:
        argv.append("--no-waive-known")
    if values.get("fuzz_requests"):
        argv.append("--fuzz-requests")
    if values.get("fuzz_known_crashes"):
        argv.append("--fuzz-known-crashes")
    if values.get("database") is not None:
        argv += ["--database", values["database"]]
    if values.get("database_read_only"):
        argv.append("--database-read-only")
    if values.get("same_server_replay"):
        argv.append("--same-server-replay")
    return argv


def _budget_s(args: argparse.Namespace) -> float:
    from scripted_runtime.user_side import engine_config
    from scripted_runtime.user_side.explore.search import PROFILES

    prof = PROFILES[args.profile]
    topology = getattr(args, "topology", None) or engine_config.topology_for(getattr(args, "pp", 1),
                                                                             getattr(args, "overlap", True))
    search = prof.search_time_s(topology, given=args.max_time)
    shrink = args.shrink_time if args.shrink_time is not None else prof.shrink_time_s
    return args.start_timeout + search + shrink + GRACE_S


def _wait(proc: subprocess.Popen, deadline_s: float, what: str) -> int:
    try:
        return proc.wait(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        print(f"scripted-runtime: {what} still running after {deadline_s:.0f}s; killed", file=sys.stderr)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return EXIT_USAGE


def run_in_build(args: argparse.Namespace) -> int:
    """``explore --sglang SPEC``: the same command in that build's interpreter."""
    from scripted_runtime.user_side.builds import envs, spec as build_spec, worktrees

    try:
        build_spec_ = build_spec.parse(args.sglang)
        base = side.base_python(args.base_env)
    except (UsageError, ValueError) as exc:
        print(f"scripted-runtime: {exc}", file=sys.stderr)
        return EXIT_USAGE
    progress = lambda line: print(f"[explore] {line}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        build = side.prepare(build_spec_, base_python=base, progress=progress)
    except (envs.EnvBuildError, worktrees.WorktreeError, OSError) as exc:
        print(f"scripted-runtime: cannot prepare {args.sglang}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    reverts = list(args.revert_fix or []) + list(build_spec_.revert)
    argv = explore_argv(args, sglang=None, revert_fix=reverts, sglang_label=args.sglang)
    progress(f"running in {build.python}: scripted-runtime {' '.join(argv)}")
    proc = subprocess.Popen([build.python, "-m", "scripted_runtime.user_side.cli", *argv], env=side.child_environment(build),
                            cwd=os.getcwd(), start_new_session=True)
    try:
        return _wait(proc, _budget_s(args) * max(1, args.workers), f"explore on {args.sglang}")
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


def run_workers(args: argparse.Namespace) -> int:
    """``explore -n N``: N workers, each with its own server; merged statistics."""
    from scripted_runtime.user_side.explore.search import PROFILES

    n = args.workers
    prof = PROFILES[args.profile]
    total = args.max_examples or prof.max_examples
    t0 = time.monotonic()
    from scripted_runtime.user_side import server as server_mod

    server_mod.share_template_with_children(getattr(args, "device", None) or "cpu", tag="explore",
                                            each="each worker", together="the workers")
    with tempfile.TemporaryDirectory(prefix="scripted-runtime-explore-") as tmp:
        stop_file = os.path.join(tmp, "stop")
        procs, stats_files = [], []
        for i in range(n):
            stats_file = os.path.join(tmp, f"worker{i}.json")
            stats_files.append(stats_file)
            seed = (args.seed + i) if args.seed is not None else (i if prof.derandomize else None)
            # the seed corpus is a fixed set: worker 0 runs it, the others would repeat it
            argv = explore_argv(args, workers=1, seed=seed, max_examples=-(-total // n),
                                stats_json=stats_file, stop_file=stop_file, worker_label=f"w{i}",
                                no_corpus=args.no_corpus or i > 0)
            procs.append(subprocess.Popen([sys.executable, "-m", "scripted_runtime.user_side.cli", *argv],
                                          start_new_session=True))
        print(f"[explore] {n} workers started (pids {', '.join(str(p.pid) for p in procs)})",
              file=sys.stderr, flush=True)
        deadline = _budget_s(args)
        try:
            codes = [_wait(p, max(1.0, deadline - (time.monotonic() - t0)), f"worker {i}")
                     for i, p in enumerate(procs)]
        except KeyboardInterrupt:
            for p in procs:
                os.killpg(p.pid, signal.SIGKILL)
            raise
        parts, failures = [], []
        for i, path in enumerate(stats_files):
            try:
                with open(path) as f:
                    payload = json.load(f)
            except (OSError, ValueError):
                print(f"[explore] worker {i} left no statistics (exit {codes[i]})", file=sys.stderr)
                continue
            if payload.get("status") != "RAN":
                print(f"[explore] worker {i}: {payload.get('status')}: {payload.get('error', '')[:300]}",
                      file=sys.stderr)
                continue
            parts.append(Stats.from_dict(payload["stats"]))
            for name, met in (payload.get("known") or {}).items():
                print(f"known (worker {i}): {name}: {met['signature']} -> {met['scenario']}")
            if payload.get("signature"):
                failures.append((i, payload))
    merged = merge_all(parts)
    print(f"=== {n} workers merged ===")
    print(merged.summary())
    print(merged.coverage_table())
    if merged.fuzz_table():
        print(merged.fuzz_table())
    for i, payload in failures:
        print(f"FAILURE (worker {i}): {payload['signature']} -> {payload.get('scenario_path')}")
    if failures:
        return EXIT_FAIL
    if len(parts) < n:
        return EXIT_USAGE
    return EXIT_PASS
