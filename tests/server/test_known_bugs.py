"""Every registered SGLang bug (``scripted_runtime/known_bugs.py``) on every
topology: its scenario asserts what SGLang should do, so it passes where the
bug does not apply, and where it does it runs as a **strict xfail** that
accepts only the registered failure (``KnownBugReproduced``): a different
failure fails the test, and the day SGLang fixes the bug the XPASS fails the
suite. Retire the entry then."""
from __future__ import annotations

from pathlib import Path

import pytest

from scripted_runtime import known_bugs
from scripted_runtime.user_side.explore.runner import posted_ops, signature_of

ROOT = Path(__file__).resolve().parents[2]

# A scenario that kills the scheduler runs after every other test (conftest):
# the server it kills is then not restarted for nothing.
# A bug's slow_topologies run in the slow lane only (conftest: slow_on).
CASES = [pytest.param(bug, kwargs, id=f"{bug.name}-{'-'.join(map(str, kwargs.values())) or 'default'}",
                      marks=([pytest.mark.crashes_server] if bug.breaks_server else [])
                      + ([pytest.mark.slow_on(*bug.slow_topologies)] if bug.slow_topologies else []))
         for bug in known_bugs.REGISTRY for kwargs in bug.variants]


class KnownBugReproduced(Exception):
    """The scenario failed exactly as its registry entry says."""


@pytest.mark.parametrize("bug,kwargs", CASES)
def test_known_bug_scenario(server, request, bug, kwargs):
    version = server.info.get("sglang_version")
    affected = bug.applies(server.topology, version)
    path, _, func = bug.scenario.partition(":")
    result = server.run(f"{ROOT / path}:{func}", invariants=bug.scenario_invariants, **kwargs)
    if result.crashed:
        assert server.pids() == [], f"{bug.name}: a crashed server must leave no process behind"
    if bug.breaks_server and not result.passed:
        # dead, or alive with an engine the next reset dies on: not the pool's
        # server for any later test (these run last: crashes_server)
        server.shutdown()
        assert server.pids() == [], f"{bug.name}: processes left after its server was shut down"
    masking = dict(bug.masked_by).get(server.topology)
    if masking is not None and masking != bug.name:
        # another registered bug fails this scenario first here: it must fail as that one says
        bug = known_bugs.by_name(masking)
        affected = bug.applies(server.topology, version)
    if not affected:
        assert result.passed, f"{bug.name}'s scenario must pass where the bug does not apply: {result.error}"
        return
    request.applymarker(pytest.mark.xfail(
        strict=True, raises=KnownBugReproduced,
        reason=f"known SGLang {version} bug {bug.name}: {bug.title} ({bug.report})"))
    if not result.passed:
        signature = signature_of(result)  # as the explorer names it
        assert bug.matches(signature, topology=server.topology, sglang_version=version,
                           message=result.error or "", ops=posted_ops(result)), \
            f"{bug.name}'s scenario failed otherwise than registered ({bug.signature}): {(result.error or '')[:400]}"
        raise KnownBugReproduced(result.error.splitlines()[0])
