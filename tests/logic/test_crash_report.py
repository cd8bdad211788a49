"""How a crash is named: the rank that crashed first, and a bare exception's place."""
from __future__ import annotations

from scripted_runtime.user_side.server import crash_line, first_crash_text

TB_BARE = '''Traceback (most recent call last):
  File "/x/sglang/srt/managers/scheduler.py", line 2120, in event_loop_overlap
    pop_and_process()
  File "/x/sglang/srt/managers/scheduler_components/logprob_result_processor.py", line 296, in add_input_logprob_return_values
    assert len(a) == b
AssertionError
'''


def test_a_bare_exception_is_named_with_where_it_was_raised():
    assert crash_line(TB_BARE) == ("AssertionError in add_input_logprob_return_values "
                                   "(logprob_result_processor.py)")
    assert crash_line("Traceback...\nIndexError: index out of range in self\n") == "IndexError: index out of range in self"
    assert crash_line("") == "no traceback"


def test_the_rank_that_crashed_first_names_the_crash(tmp_path):
    (tmp_path / "crash-pp0-tp0-1.txt").write_text("200.5\nTraceback\nRuntimeError: Connection closed by peer\n")
    (tmp_path / "crash-pp3-tp0-4.txt").write_text("200.1\nTraceback\nRuntimeError: selected index k out of range\n")
    text = first_crash_text(tmp_path)
    assert crash_line(text.split("\n\n[later: ")[0]) == "RuntimeError: selected index k out of range"
    assert "[later: crash-pp0-tp0-1.txt]" in text and "Connection closed by peer" in text
    assert first_crash_text(tmp_path / "none") is None
