"""The pytest plugin's own parts: its ``pytest11`` entry point is installed,
the marker's validation, and how the marker and the command line combine
into a server configuration. A foreign project using it on real servers:
tests/server/test_pytest_plugin.py."""
from __future__ import annotations

import importlib.metadata
import re

import pytest

from scripted_runtime import pytest_plugin
from scripted_runtime.user_side.server_config import ServerConfig

pytest_plugins = ["pytester"]


def test_the_plugin_is_an_installed_pytest11_entry_point():
    eps = [e for e in importlib.metadata.entry_points(group="pytest11") if e.name == "scripted_runtime"]
    assert [e.value for e in eps] == ["scripted_runtime.pytest_plugin"], "run bash ci/install.sh"


@pytest.mark.parametrize("kwargs, words", [
    ({"pp": 2}, "--pp must be 1 or 4"),
    ({"threads": 3}, "unknown argument(s) threads"),
])
def test_a_bad_marker_is_a_usage_error(kwargs, words):
    mark = pytest.mark.scripted_runtime(**kwargs).mark
    with pytest.raises(pytest.UsageError, match=re.escape(words)):
        pytest_plugin.marker_config(mark)


def test_marker_and_command_line_build_options_combine():
    mark = pytest.mark.scripted_runtime(pp=1, overlap=False, sglang_args={"chunked_prefill_size": 32},
                                        patches=["mut_x"]).mark
    cfg = pytest_plugin.marker_config(mark, revert_fixes=["pr27446"], patches=["mine.py:P"])
    assert cfg == ServerConfig(topology="pp1-normal", engine_overrides={"chunked_prefill_size": 32},
                               revert_fixes=("pr27446",), patches=("mine.py:P", "mut_x"), extensions=())
    assert pytest_plugin.marker_config(None) == ServerConfig(topology="pp1-overlap")
    assert pytest_plugin.marker_config(None, device="cuda").device == "cuda"


PRESTART_TESTS = '''
import pytest

def test_needs_a_server(scripted_runtime_pool):
    pass

@pytest.mark.skip(reason="not this time")
def test_skipped_with_a_server(scripted_runtime_pool):
    pass

def test_pure():
    pass
'''


@pytest.mark.parametrize("args, started", [
    ((), True),                                     # a test will need a server: the template starts
    (("-k", "pure"), False),                        # none selected needs one
    (("-k", "skipped"), False),                     # the only one that would is skipped
    (("--collect-only",), False),                   # nothing runs
    (("--scripted-runtime-device", "cuda"), False),  # GPU servers are spawned, never forked
])
def test_the_template_starts_at_collection_only_when_a_selected_test_needs_a_server(
        pytester, monkeypatch, args, started):
    from scripted_runtime.user_side import server as server_mod

    asked = []  # in place of the template's start (the plugin's thread calls it): say that it was asked for
    monkeypatch.setattr(server_mod, "prestart_template", lambda device="cpu": asked.append(device))
    pytester.makepyfile(test_some=PRESTART_TESTS)
    pytester.runpytest_inprocess("-p", "no:cacheprovider", *args)  # its session's end joins the thread
    assert asked == (["cpu"] if started else [])
