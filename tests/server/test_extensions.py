"""The example extension module (``scenarios/extension_example.py``) on a
real pp1-normal server (slow lane): ``run``'s output and a ci ``explore``.
Registration, name clashes and usage errors: tests/logic/test_extensions.py."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from scripted_runtime import extensions as ext
from tests.helpers import isolate_extensions

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "scenarios/extension_example.py"


@pytest.fixture(scope="module")
def example_server(server_pool):
    """One pp1-normal server with the example module loaded in its rank
    (the plugin's pool: started once, shared by the two tests below)."""
    with pytest.MonkeyPatch.context() as mp:
        isolate_extensions(mp)
        ext.activate([str(ROOT / EXAMPLE)])  # in this process too, as --extension does
        yield server_pool.get("pp1-normal", extensions=[EXAMPLE])


@pytest.mark.slow  # a server of its own (~25 s); the default lane keeps the pure tests (tests/logic/test_extensions.py)
def test_run_shows_the_window_and_action_and_the_invariant_fails_a_broken_request(example_server, capsys):
    """What ``scripted-runtime run --extension ...`` prints, through the
    command's own output functions, for both example scenarios."""
    from scripted_runtime.user_side import cli

    cli._print_extensions(example_server.info)
    results = [example_server.run(f"{ROOT / EXAMPLE}:{name}", trace=False)
               for name in ("uses_all_three", "budget_broken")]
    for result in results:
        cli._report(result)
    out = capsys.readouterr().out
    assert ("extensions loaded in the scheduler: windows two_or_more_waiting; invariants output_within_budget; "
            "actions abort_newest_then_step") in out
    assert results[0].passed, out
    assert re.search(r"windows reached: .*two_or_more_waiting x\d", out), out
    assert not results[1].passed and "InvariantViolation[output_within_budget]" in out, out


@pytest.mark.slow
def test_explore_draws_the_action_counts_the_window_and_checks_the_invariant(example_server, tmp_path):
    from scripted_runtime.user_side.explore import explorer
    from scripted_runtime.user_side.explore.explore_settings import ExploreSettings
    from scripted_runtime.user_side.server_config import ServerConfig

    lines = []
    report = explorer.explore(ServerConfig("pp1-normal", extensions=(EXAMPLE,)),
                              ExploreSettings(profile="ci", max_examples=25, corpus=False, check_determinism=False),
                              server=example_server, out_dir=tmp_path, progress=lines.append)
    explorer.print_report(report, profile="ci", out=lines.append)
    out = "\n".join(lines)
    assert not report.failed, out  # the invariant found nothing on the real scheduler
    assert re.search(r"windows \(reached/entered\): .*two_or_more_waiting \d+/\d+", out), out
    row = next((line for line in lines if "ext:abort_newest_then_step" in line), "")
    assert re.search(r"\| +\d+ ", row), out  # the action ran in some phase
