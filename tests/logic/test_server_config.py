"""``ServerConfig``: one frozen value for which server; the command line
builds it in one helper; the pool, the pytest marker and
``ScriptedServer.start``'s keyword form agree with it. No server starts."""
from __future__ import annotations

import dataclasses

import pytest

from scripted_runtime.user_side import cli, mutate
from scripted_runtime.user_side.explore import writer
from scripted_runtime.user_side.pool import ServerPool
from scripted_runtime.user_side.server import ScriptedServer, config_from_keywords
from scripted_runtime.user_side.server_config import ServerConfig

MUTANT = mutate.default_mutants()[0]


def test_a_config_is_frozen_and_normalized():
    config = ServerConfig("pp4", engine_overrides={"b": 2, "a": 1}, revert_fixes=["pr27446"], patches="x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.topology = "pp1-normal"
    assert config.engine_overrides == (("a", 1), ("b", 2)) and config.revert_fixes == ("pr27446",)
    assert config.patches == ("x",) and config.overrides == {"a": 1, "b": 2}
    assert ServerConfig(checks=["idle_gate"]).checks == ("idle_gate",) and ServerConfig(checks=[]).checks is False
    assert config == ServerConfig("pp4", engine_overrides={"a": 1, "b": 2}, revert_fixes=("pr27446",), patches=("x",))


def test_the_key_is_stable_and_changes_with_each_identity_field():
    base = ServerConfig("pp1-normal", engine_overrides={"b": 2, "a": 1})
    assert base.key() == ServerConfig("pp1-normal", engine_overrides={"a": 1, "b": 2}).key()
    assert base.key() == ('{"device": "cpu", "engine": [["a", 1], ["b", 2]], "extensions": [], "patches": [], '
                          '"revert_fixes": [], "topology": "pp1-normal"}')  # the same in every process
    changed = [base.replace(topology="pp4"), base.replace(device="cuda"), base.replace(engine_overrides={"a": 2}),
               base.replace(revert_fixes=("pr27446",)), base.replace(patches=(MUTANT,)),
               base.replace(extensions=("mine.py",))]
    assert len({base.key(), *(c.key() for c in changed)}) == 1 + len(changed)
    # the checks are applied per run, not at start: the same server
    assert base.replace(checks=False).key() == base.key()


def test_validation_names_what_cannot_run():
    ServerConfig("pp4", revert_fixes=("pr27446",), patches=(MUTANT,)).validate()
    for bad, words in ((ServerConfig("pp3"), "topology must be one of"), (ServerConfig(device="tpu"), "device"),
                       (ServerConfig(revert_fixes=("pr1",)), "unknown fix toggle"),
                       (ServerConfig(patches=("nope",)), "unknown patch"),
                       (ServerConfig(checks=("no_such_check",)), "unknown invariant")):
        with pytest.raises(ValueError, match=words):
            bad.validate()


def _run_args(*flags):
    return cli.build_parser().parse_args(["run", "s.py:f", *flags])


def test_the_command_line_flags_make_one_config():
    args = _run_args("--pp", "4", "--sglang-arg", "chunked_prefill_size=32", "--revert-fix", "pr27446",
                     "--patch", MUTANT, "--skip-invariant", "idle_gate", "--device", "cuda")
    config = cli.server_config(args)
    from scripted_runtime.scheduler_side import invariants

    assert config == ServerConfig("pp4", device="cuda", engine_overrides={"chunked_prefill_size": 32},
                                  revert_fixes=("pr27446",), patches=(MUTANT,),
                                  checks=tuple(n for n in invariants.all_names() if n != "idle_gate"))
    assert cli.server_config(_run_args("--no-overlap", "--no-invariants")) == ServerConfig("pp1-normal", checks=False)
    assert cli.server_config(_run_args()) == ServerConfig()
    explore = cli.build_parser().parse_args(["explore", "--topology", "pp1-hicache", "--no-invariants"])
    assert cli.server_config(explore) == ServerConfig("pp1-hicache", checks=False)
    mut = cli.build_parser().parse_args(["mutate", "--device", "cuda"])
    assert cli.server_config(mut, topology="pp4", patches=[]) == ServerConfig("pp4", device="cuda")
    for flags, words in ((("--pp", "2"), "--pp must be 1 or 4"), (("--revert-fix", "pr1"), "unknown fix toggle"),
                         (("--skip-invariant", "nope"), "unknown invariant"),
                         (("--no-invariants", "--skip-invariant", "nope"), "unknown invariant")):
        with pytest.raises(ValueError, match=words):
            cli.server_config(_run_args(*flags))
    with pytest.raises(cli.UsageError, match="--topology: unknown 'pp9'"):
        cli.server_config(cli.build_parser().parse_args(["explore", "--topology", "pp9"]))


@pytest.mark.parametrize("config", [
    ServerConfig(), ServerConfig("pp4", revert_fixes=("pr27446",), patches=(MUTANT,), checks=False),
    ServerConfig("pp1-normal", device="cuda", engine_overrides={"chunked_prefill_size": 32, "enable_x": True},
                 checks=("idle_gate", "pause")),
])
def test_the_printed_options_start_the_same_config(config):
    assert cli.server_config(_run_args(*config.as_argv())) == config


def test_the_replay_command_is_the_one_written_before():
    assert writer.replay_command("p.py", ServerConfig()) == "scripted-runtime run p.py:program"
    config = ServerConfig("pp4", revert_fixes=("pr27446",), patches=("x",), extensions=("e.py",), checks=False)
    assert writer.replay_command("p.py", config) == (
        "scripted-runtime run p.py:program --pp 4 --no-invariants --extension e.py --revert-fix pr27446 --patch x")
    assert writer.replay_command("p.py", config, sglang="sglang==0.5.13") == (
        "scripted-runtime bisect-check p.py:program --sglang sglang==0.5.13 --pp 4 --no-invariants --extension e.py")
    assert writer.replay_command("p.py", ServerConfig("pp1-hicache")).startswith(
        "scripted-runtime run p.py:program --no-overlap --sglang-arg enable_hierarchical_cache=true")


def test_start_keywords_pool_and_marker_make_the_same_config():
    from scripted_runtime import pytest_plugin

    assert config_from_keywords(topology="pp4", revert_fixes=["pr27446"], chunked_prefill_size=32) == ServerConfig(
        "pp4", revert_fixes=("pr27446",), engine_overrides={"chunked_prefill_size": 32})
    with pytest.raises(TypeError, match="not both"):
        ScriptedServer.start(ServerConfig(), topology="pp4")
    pool = ServerPool(device="cuda", chunked_prefill_size=32)
    assert pool.config("pp1-normal", engine_overrides={"max_total_tokens": 64}, patches=[MUTANT]) == ServerConfig(
        "pp1-normal", device="cuda", engine_overrides={"chunked_prefill_size": 32, "max_total_tokens": 64},
        patches=(MUTANT,))
    mark = pytest.mark.scripted_runtime(pp=4, sglang_args={"chunked_prefill_size": 32}).mark
    assert pytest_plugin.marker_config(mark, device="cuda") == pool.config("pp4")
