"""The harness's trainer rank: a process of its own that joins a
scheduler's weight-update process group as rank 0 and broadcasts a
checkpoint's tensors over it, as an RL trainer does before
``/update_weights_from_distributed`` (started and driven by
``weight_trainer.WeightTrainer``, in the scheduler's process).

One JSON command a line on stdin, one JSON answer a line on stdout:

* ``{"op": "join", "group": G, "port": P, "world_size": N, "backend": B}``:
  answers ``{"joining": G}`` (the store is up: the scheduler may be told to
  join now), then ``{"joined": G}`` once the group formed, or
  ``{"error": ...}``.
* ``{"op": "broadcast", "group": G, "path": FILE_OR_DIR, "names": [...]}``:
  broadcasts those tensors of the safetensors checkpoint, in that order,
  from rank 0; answers ``{"broadcast": G, "tensors": n}``.
* ``{"op": "leave", "group": G}``: destroys its side of the group.

It exits at the end of stdin, and when its parent (the scheduler) dies:
the kernel kills it (``PR_SET_PDEATHSIG``), and a watchdog thread checks
the parent where that is not available.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time


def _die_with_parent(parent: int) -> None:
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the watchdog below still ends it
        pass
    if os.getppid() != parent:  # the parent died before the prctl took
        os._exit(0)

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(0)
            time.sleep(0.5)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def _emit(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _tensors(path: str, names: list) -> list:
    from safetensors.torch import load_file

    files = ([path] if path.endswith(".safetensors")
             else sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors")))
    found = {}
    for f in files:
        found.update(load_file(f))
    missing = [n for n in names if n not in found]
    if missing:
        raise KeyError(f"not in the checkpoint {path}: {missing[:4]}")
    return [found[n].contiguous() for n in names]


def main() -> int:
    _die_with_parent(int(sys.argv[1]))
    import torch

    from scripted_runtime.hooks import sglang_compat

    groups = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        op, group = cmd.get("op"), cmd.get("group")
        try:
            if op == "join":
                _emit({"joining": group})
                groups[group] = sglang_compat.join_custom_process_group(
                    backend=cmd["backend"], init_method=f"tcp://127.0.0.1:{cmd['port']}",
                    world_size=cmd["world_size"], rank=0, group_name=group)
                _emit({"joined": group})
            elif op == "broadcast":
                tensors = _tensors(cmd["path"], cmd["names"])
                for t in tensors:
                    torch.distributed.broadcast(t, src=0, group=groups[group])
                _emit({"broadcast": group, "tensors": len(tensors)})
            elif op == "leave":
                pg = groups.pop(group, None)
                if pg is not None:
                    torch.distributed.destroy_process_group(pg)
                _emit({"left": group})
            else:
                _emit({"error": f"unknown command {cmd!r}"})
        except Exception as e:  # noqa: BLE001 - answered, the scheduler side reports it
            _emit({"error": f"{op} {group}: {type(e).__name__}: {e}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
