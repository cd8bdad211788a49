"""The weight-version contract (``scheduler_side/weight_version_contract.py``)
and the tracker's record of version changes: pure logic, small fakes, and
SGLang's own span builder (where it is installed) as a second reading."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from scripted_runtime.scheduler_side import weight_version_contract as wv
from scripted_runtime.scheduler_side.http_poster import HttpAnswer
from scripted_runtime.scheduler_side.request_tracker import RequestTracker


def _req(rid, n=0, reason=None):
    return SimpleNamespace(rid=rid, output_ids=list(range(n)), finished_reason=reason)


def test_a_request_no_version_change_reached_is_one_span_of_the_version_it_finished_under():
    assert wv.expected_spans([], "v0", 5) == [{"version": "v0", "start": 0, "end": 5}]
    # no output: one empty span (SGLang's compute_weight_version_spans with 0 tokens)
    assert wv.expected_spans([], "v0", 0) == [{"version": "v0", "start": 0, "end": 0}]


def test_each_change_splits_the_tokens_made_before_it_from_those_after():
    events = [("v0", 2), ("v1", 5)]
    assert wv.token_versions(events, "v2", 7) == ["v0", "v0", "v1", "v1", "v1", "v2", "v2"]
    assert wv.expected_spans(events, "v2", 7) == [{"version": "v0", "start": 0, "end": 2},
                                                  {"version": "v1", "start": 2, "end": 5},
                                                  {"version": "v2", "start": 5, "end": 7}]


def test_runs_of_one_version_are_one_span():
    assert wv.expected_spans([("a", 1), ("b", 1), ("a", 2)], "b", 3) == [
        {"version": "a", "start": 0, "end": 2}, {"version": "b", "start": 2, "end": 3}]
    assert wv.expected_spans([("a", 2), ("a", 4)], "a", 6) == [{"version": "a", "start": 0, "end": 6}]


def test_the_violation_names_what_the_answer_says_and_what_its_tokens_make():
    want = [{"version": "v0", "start": 0, "end": 2}, {"version": "v1", "start": 2, "end": 4}]
    assert wv.violation({"weight_versions": want, "weight_version": "v1"}, want) is None
    wrong = [{"version": "v1", "start": 0, "end": 4}]
    msg = wv.violation({"weight_versions": wrong, "weight_version": "v1"}, want)
    assert "reports weight_versions" in msg and "'v0'" in msg
    assert "weight_version 'v0'" in wv.violation({"weight_versions": want, "weight_version": "v0"}, want)
    assert "no weight_versions" in wv.violation({"weight_version": "v1"}, want)
    assert "no meta_info" in wv.violation(None, want)


def test_the_tracker_records_a_boundary_on_live_requests_with_output_and_the_version_a_finished_one_had():
    t = RequestTracker()
    running, waiting_fresh, done = _req("r", 3), _req("w", 0), _req("d", 4, reason="length")
    t.reqs.update({"r": running, "d": done})
    t.by_ingest.update({"r": [running], "w": [waiting_fresh], "d": [done], "x": [None]})
    t.on_version_change("v0", "v0")  # no change: nothing
    assert t.version_events == {} and t.finish_version == {}
    t.on_version_change("v0", "v1")
    assert t.version_events == {id(running): [("v0", 3)]}  # once, though it is in both maps
    assert t.finish_version == {id(done): "v0"}
    running.output_ids.append(9)
    waiting_fresh.output_ids.append(1)
    done.output_ids.append(5)  # finished: nothing it gains counts
    t.on_version_change("v1", "v2")
    assert t.version_events == {id(running): [("v0", 3), ("v1", 4)], id(waiting_fresh): [("v1", 1)]}
    assert t.finish_version == {id(done): "v0"}  # the first change after its finish names it
    t.clear()
    assert t.version_events == {} and t.finish_version == {}


class _Handle:
    def __init__(self, rid, body, record, status="finished", reason="length"):
        self.rid, self.status = rid, status
        self.last_req = SimpleNamespace(finished_reason=SimpleNamespace(type=reason) if reason else None)
        if reason == "abort":
            self.last_req.finished_reason = type("FINISH_ABORT", (), {})()
        self.http = HttpAnswer(status=200, body=body)
        self.http.mark_answered()
        self.weight_version_record = record


def test_the_end_check_judges_finished_answers_against_the_record_and_skips_the_rest():
    good = _Handle("a", {"output_ids": [1, 2, 3], "meta_info": {
        "weight_versions": [{"version": "v0", "start": 0, "end": 1}, {"version": "v1", "start": 1, "end": 3}],
        "weight_version": "v1"}}, ([("v0", 1)], None))
    aborted = _Handle("b", {"output_ids": [1], "meta_info": {}}, ([], None), status="aborted", reason="abort")
    assert wv.check_answers([good, aborted], current_version="v1") == 1
    # finished under v0 before the change to v1: its answer must say v0
    early = _Handle("c", {"output_ids": [1], "meta_info": {
        "weight_versions": [{"version": "v1", "start": 0, "end": 1}], "weight_version": "v1"}}, ([], "v0"))
    with pytest.raises(wv.WeightVersionError, match="request c: .*made under .*'v0'"):
        wv.check_answers([early], current_version="v1")
    # a retracted request whose boundary SGLang forgot (blind set 6's class of bug)
    forgot = _Handle("d", {"output_ids": [1, 2, 3, 4], "meta_info": {
        "weight_versions": [{"version": "v1", "start": 0, "end": 4}], "weight_version": "v1"}}, ([("v0", 2)], None))
    with pytest.raises(wv.WeightVersionError, match="v0 at 2 tokens"):
        wv.check_answers([forgot], current_version="v1")
    assert wv.check_answers([forgot], current_version=None) == 0  # an SGLang without labels


# SGLang's own builder, as a second reading of the rule (where SGLang is installed)
@settings(max_examples=300, deadline=None)
@given(lengths=st.lists(st.integers(1, 12), max_size=5), versions=st.lists(st.sampled_from("abc"), min_size=6,
                                                                              max_size=6), extra=st.integers(0, 6))
def test_the_spans_are_sglangs_own_for_the_same_events(lengths, versions, extra):
    weight_versions = pytest.importorskip("sglang.srt.utils.weight_versions")
    lengths = sorted(lengths)  # output only grows between changes
    events = list(zip(versions, lengths))
    n = (lengths[-1] if lengths else 0) + extra
    spans = weight_versions.compute_weight_version_spans(
        [weight_versions.WeightVersionEvent(old_version=v, num_output_tokens=k) for v, k in events],
        current_version=versions[-1], num_output_tokens=n)
    meta = {}
    weight_versions.add_weight_versions_to_meta_info(meta, spans, num_output_tokens=n)
    assert meta["weight_versions"] == wv.expected_spans(events, versions[-1], n)
    assert wv.violation(meta, wv.expected_spans(events, versions[-1], n)) is None
