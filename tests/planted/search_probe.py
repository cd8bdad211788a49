"""A search on a fake runner, for the failure-database tests: run as a
separate process (``python tests/planted/search_probe.py DATABASE``), it
explores with the given database; a program that pauses generation
"fails". Prints one JSON line: the programs it ran, in order, and what it
saved. No server: what is tested is the database, not SGLang."""
from __future__ import annotations

import json
import sys

from scripted_runtime.user_side.explore import actions as A, failure_db, search
from scripted_runtime.user_side.explore.explore_settings import ExploreSettings
from scripted_runtime.user_side.explore.runner import Outcome
from scripted_runtime.user_side.server_config import ServerConfig


class PauseFails:
    topology = "pp1-normal"
    info = {"sglang_version": "0.5.23"}
    restarts = 0

    def __init__(self):
        self.ran = []

    def run(self, program, trace=False):
        self.ran.append(failure_db.encode(program).decode())
        fails = any(isinstance(a, (A.Pause, A.RlCycle)) for a in program)  # an RL cycle pauses first
        return Outcome(signature="ContractViolation[pause]" if fails else None, message="planted")


def main() -> None:
    spec, read_only = sys.argv[1], "--read-only" in sys.argv
    db = failure_db.open_database(spec, read_only=read_only)
    store = failure_db.FailureStore(db, failure_db.key(ServerConfig("pp1-normal"), "0.5.23"))
    runner, lines = PauseFails(), []
    result = search.search(runner, ExploreSettings(profile="ci", max_examples=30, shrink_time_s=5, corpus=False,
                                                   known_bugs=()), store=store, progress=lines.append)
    if result.program is not None:
        store.save(result.program)
    print(json.dumps({"ran": runner.ran, "progress": lines, "stored": [failure_db.encode(p).decode()
                                                                       for p in store.programs()]}))


if __name__ == "__main__":
    main()
