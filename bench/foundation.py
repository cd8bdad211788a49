"""Foundation figures: harness vs. SGLang's plain Engine on this machine.

    .venv/bin/python bench/foundation.py [--topologies pp1-overlap,pp1-normal,pp4] [--decode 200]

For each topology: server start to first script, steps/s of a long decode
script, shutdown time and processes left; the plain Engine does the same work
(same engine arguments, same CPU patches, no scheduler hook). Prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hooks import sglang_compat  # noqa: E402
from scripted_runtime import ScriptedServer, engine_config, processes  # noqa: E402
from scripted_runtime.models import files as model_files  # noqa: E402


def decode_script(ctx, n):
    r = ctx.start_req(prompt_len=16, max_new_tokens=n, ignore_eos=True)
    t0 = None
    steps = 0
    while not r.finished:
        yield
        steps += 1
        if t0 is None and len(r.output_ids) >= 1:
            import time as _t
            t0, first = _t.monotonic(), steps
    import time as _t
    return {"decode_steps": steps - first, "decode_s": _t.monotonic() - t0, "tokens": len(r.output_ids)}


def harness(topology: str, n: int) -> dict:
    t0 = time.monotonic()
    server = ScriptedServer.start(topology=topology)
    start_s = time.monotonic() - t0
    server.run(decode_script, 8).raise_if_failed()
    result = server.run(decode_script, n).raise_if_failed()
    shutdown_s = server.shutdown()
    left = processes.pids_of_server(server.server_id)
    v = result.value
    return {"start_s": start_s, "steps_per_s": v["decode_steps"] / v["decode_s"],
            "tokens_per_s": (v["tokens"] - 1) / v["decode_s"],
            "shutdown_s": shutdown_s, "left": len(left)}


def plain(topology: str, n: int) -> dict:
    kwargs = engine_config.engine_kwargs("cpu", topology)
    kwargs["model_path"] = str(model_files.model_dir("tiny-qwen2"))
    kwargs["log_level"] = "error"
    env = {**sglang_compat.SERVER_ENV, **os.environ,
           "SCRIPTED_RUNTIME_HOOKS": "1", "SCRIPTED_RUNTIME_SCHEDULER_HOOK": "0",
           "PYTHONPATH": f"{ROOT / 'hooks' / '_site'}{os.pathsep}{ROOT}",
           "SGLANG_CPU_OMP_THREADS_BIND": sglang_compat.omp_bind_rule(
               sglang_compat.installed_sglang_version()).value(
               tp_size=1, pp_size=kwargs.get("pp_size", 1), cores=os.cpu_count() or 1)}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "plain_engine.py"), json.dumps(kwargs), str(n)],
                          env=env, capture_output=True, text=True, timeout=600, start_new_session=True)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("{")), None)
    if line is None:
        raise RuntimeError(f"plain engine failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(line)
    return {"start_s": out["start_s"], "tokens_per_s": (out["decode_tokens"] - 1) / out["decode_s"],
            "shutdown_s": out["shutdown_s"], "left": None, "wall_s": time.monotonic() - t0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--topologies", default="pp1-overlap,pp1-normal,pp4")
    ap.add_argument("--decode", type=int, default=200)
    args = ap.parse_args()
    rows = []
    for topology in args.topologies.split(","):
        print(f"[bench] {topology}: harness...", file=sys.stderr, flush=True)
        h = harness(topology, args.decode)
        print(f"[bench] {topology}: plain Engine...", file=sys.stderr, flush=True)
        p = plain(topology, args.decode)
        rows.append((topology, h, p))
    print(f"\nsglang {sglang_compat.installed_sglang_version()}, {os.cpu_count()} cores, "
          f"tiny Qwen2 on CPU, {args.decode}-token decode\n")
    print("| topology | what | harness | plain Engine | ratio |")
    print("|---|---|---|---|---|")
    for topology, h, p in rows:
        print(f"| {topology} | start to first script (s) | {h['start_s']:.1f} | {p['start_s']:.1f} | {h['start_s'] / p['start_s']:.2f}x |")
        print(f"| {topology} | decode tokens/s | {h['tokens_per_s']:.0f} | {p['tokens_per_s']:.0f} | {h['tokens_per_s'] / p['tokens_per_s']:.2f}x |")
        print(f"| {topology} | script steps/s (iterations) | {h['steps_per_s']:.0f} | | |")
        print(f"| {topology} | shutdown (s) | {h['shutdown_s']:.2f} | {p['shutdown_s']:.2f} | |")
        print(f"| {topology} | processes left after shutdown | {h['left']} | | |")


if __name__ == "__main__":
    main()
