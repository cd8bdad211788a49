"""The abstract state of one scheduler iteration (scheduler process): a
small tuple of bucketed counts, so the explorer can tell a program that
drove the scheduler somewhere new from one that repeated known ground
(``user_side/explore/novelty.py``).

It is computed once per iteration, after the script yielded, by the step
observer (``step_observer.after_script``), only for a script run with
``RunScript.abstract_states`` (the explorer's programs); otherwise the
observer never calls in here. It reads counters SGLang keeps anyway
(queue lengths, the allocator's and the tree's sizes), never walks a
request list longer than the running batch, so it stays within a few
microseconds per iteration (``bench/abstract_state_cost.py`` times it on
the logic tests' stand-in scheduler).

The fields, each bucketed (``count_bucket``: 0, 1, 2-3, 4+):

=====  ==================================================================
``w``  requests in the waiting queue
``r``  requests in the running batch
``d``  a finished request still held by the running batch (1/0): issue
       14062's window
``c``  a chunked prefill between two chunks (``chunked_req`` set, 1/0)
``p``  the engine paused (1/0)
``f``  launched batches whose result is not processed yet: PP microbatch
       slots holding a batch, plus the overlap loop's ``result_queue``
``k``  KV pool occupancy: 0 empty, then quarters 1..4 (tree cache included)
``t``  radix tree tokens: 0, up to one 64-token chunk, up to 4 chunks, more
=====  ==================================================================

and the control operations the scheduler processed in this iteration, each
with the phase of the state it was processed against (the previous
iteration's state: ``phase_of``) and ``:refused`` when the scheduler said
no. As a string key (``key_of``): ``w1r1d0c1p0f0k2t1+flush_cache:refused@prefill``.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Set, Tuple

from scripted_runtime.hooks import sglang_compat

FIELDS = ("w", "r", "d", "c", "p", "f", "k", "t")
CHUNK_TOKENS = 64  # the explorer's chunked_prefill_size (engine_config.COMMON)

State = Tuple[Any, ...]  # the FIELDS' values, then a tuple of (operation, phase)


def count_bucket(n: int) -> int:
    """0, 1, 2-3, 4+ -> 0..3: what a race needs told apart (none, one, a
    few, a crowd), not the exact count."""
    if n <= 1:
        return max(n, 0)
    return 2 if n <= 3 else 3


def occupancy_bucket(used: int, total: int) -> int:
    """0 when nothing is used, else the quarter of ``total`` used, 1..4."""
    if used <= 0 or total <= 0:
        return 0
    return 1 + min(3, (4 * used - 1) // total)


def tree_bucket(tokens: int) -> int:
    """0, up to one chunk, up to four chunks, more -> 0..3."""
    if tokens <= 0:
        return 0
    if tokens <= CHUNK_TOKENS:
        return 1
    return 2 if tokens <= 4 * CHUNK_TOKENS else 3


def _size(obj: Any, name: str) -> int:
    """``obj.name()`` as an int; 0 when it is missing or fails (a stat that
    cannot be read is not a reason to fail the script). Unified radix caches
    (0.5.2x) report some sizes as (full, other) tuples."""
    fn = getattr(obj, name, None)
    if fn is None:
        return 0
    try:
        value = fn()
    except Exception:  # noqa: BLE001
        return 0
    return int(value[0] if isinstance(value, tuple) else value)


def counts_of(s: Any) -> Tuple[int, ...]:
    """The FIELDS of the scheduler ``s`` now, bucketed."""
    running = getattr(s, "running_batch", None)
    running_reqs = (getattr(running, "reqs", None) or ()) if running is not None else ()
    done = 0
    for req in running_reqs:
        if req.finished():
            done = 1
            break
    in_flight = len(getattr(s, "result_queue", None) or ())
    for batch in getattr(s, "mbs", None) or ():
        if batch is not None and getattr(batch, "reqs", None):
            in_flight += 1
    allocator = s.token_to_kv_pool_allocator
    total = int(getattr(allocator, "size", 0) or 0)
    tree = s.tree_cache
    return (
        count_bucket(len(getattr(s, "waiting_queue", None) or ())),
        count_bucket(len(running_reqs)),
        done,
        0 if getattr(s, "chunked_req", None) is None else 1,
        1 if sglang_compat.is_paused(s) else 0,
        count_bucket(in_flight),
        occupancy_bucket(total - _size(allocator, "available_size"), total),
        tree_bucket(_size(tree, "evictable_size") + _size(tree, "protected_size")),
    )


def phase_of(counts: Optional[Tuple[int, ...]]) -> str:
    """The one coarse phase of a state, by precedence: what a control
    operation processed against it met first (``idle`` before any state)."""
    if counts is None:
        return "idle"
    waiting, running, done, chunked, paused, in_flight = counts[:6]
    if paused:
        return "paused"
    if chunked:
        return "prefill"
    if in_flight:
        return "in_flight"
    if done:
        return "finished_unpruned"
    if running:
        return "decode"
    return "queued" if waiting else "idle"


def op_label(name: str, answer: Any) -> str:
    """A control operation's short name (``abort(RID)`` is ``abort``),
    ``:refused`` added when the scheduler answered ``success=False``."""
    if name.startswith("abort("):
        name = "abort"
    elif name.startswith("pause_generation"):
        name = "pause" + name[len("pause_generation"):]
    elif name == "continue_generation":
        name = "continue"
    elif name == "update_weights_from_disk":
        name = "update_weights"
    elif name.startswith(("release_memory_occupation", "resume_memory_occupation")):
        name = name.partition("_")[0]  # release / resume
    if answer is not None and getattr(answer, "success", True) is False:
        name += ":refused"
    return name


def key_of(state: State) -> str:
    """The compact string a state travels and is stored as."""
    text = "".join(f"{field}{value}" for field, value in zip(FIELDS, state))
    return text + "".join(f"+{op}@{phase}" for op, phase in state[len(FIELDS)])


def parse_key(key: str) -> dict:
    """``key_of``'s string back as {field: value, "ops": [(op, phase)]} (for
    reading a stored coverage, and the tests)."""
    head, *ops = key.split("+")
    out: dict = {}
    i = 0
    for field in FIELDS:
        assert head[i] == field, (key, field)
        j = i + 1
        while j < len(head) and head[j].isdigit():
            j += 1
        out[field] = int(head[i + 1:j])
        i = j
    out["ops"] = [tuple(op.rsplit("@", 1)) for op in ops]
    return out


class AbstractStates:
    """The distinct abstract states one script reached. ``begin(True)``
    turns it on for a script; off, ``observe`` is never called (the
    observer checks ``enabled``), so it costs one attribute read."""

    def __init__(self) -> None:
        self.enabled = False
        self._seen: Set[State] = set()
        self._prev: Optional[Tuple[int, ...]] = None

    def begin(self, enabled: bool) -> None:
        self.enabled = enabled
        self._seen = set()
        self._prev = None

    def observe(self, s: Any, processed: Sequence[Any] = ()) -> None:
        """Record the state ``s`` is in now; ``processed``: the control
        operations (``ControlOp``) the scheduler processed in the iteration
        that led here, each met in the phase of the state before it."""
        counts = counts_of(s)
        ops: Tuple[Tuple[str, str], ...] = ()
        if processed:
            phase = phase_of(self._prev)
            ops = tuple((op_label(op.name, op.answer), phase) for op in processed)
        self._seen.add(counts + (ops,))
        self._prev = counts

    def keys(self) -> Tuple[str, ...]:
        """The states reached so far, as sorted string keys (what
        ``ScriptDone.states`` carries)."""
        return tuple(sorted(key_of(state) for state in self._seen))
