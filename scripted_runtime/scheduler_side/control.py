"""Control operations a script injects, and what the server answered.

Every operation (flush_cache, pause_generation, continue_generation, abort,
update_weights_from_disk) returns a ``ControlOp``. Two answers are recorded:

* ``answer``: the scheduler's own reply object, captured in the iteration
  that processed the request (deterministic: visible right after that yield);
* ``http``: the HTTP response, which arrives asynchronously.

The ledger wraps the scheduler's request dispatcher to capture the first.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from scripted_runtime.scheduler_side.http_poster import HttpAnswer


@dataclass
class ControlOp:
    name: str
    request_type: str  # the scheduler-side input type, e.g. "FlushCacheReqInput"
    rid: Optional[str]
    posted_step: int
    http: HttpAnswer
    arrived: bool = False
    processed_step: Optional[int] = None
    answer: Any = None  # the scheduler's reply object (None for ops without one)
    describe: Optional[Callable[[], str]] = field(default=None, repr=False)
    payload: Dict[str, Any] = field(default_factory=dict, repr=False)  # what was posted (the HTTP body)
    keep_alive: Any = field(default=None, repr=False)  # what must live until the scheduler read it (shared tensors)
    # False for an op SGLang's tokenizer never sends on (pause_generation(abort)): no frame is paired with it
    forwarded: bool = True

    @property
    def processed(self) -> bool:
        return self.processed_step is not None

    @property
    def done(self) -> bool:
        return self.processed

    @property
    def settled(self) -> bool:
        """Processed, or answered over HTTP without its request having
        reached the scheduler (the tokenizer answered it itself: a
        ``pause_generation(abort)``, a refusal). An answered op whose request
        reached the scheduler's socket is not settled until processed:
        SGLang's tokenizer answers a retract or in-place pause and a continue
        as soon as it has sent them on, so their answer races the script and
        says nothing about the scheduler (the ops it waits on the scheduler
        for answer after being processed anyway)."""
        if self.processed:
            return True
        return self.http.done and not self.arrived

    @property
    def success(self) -> Optional[bool]:
        """The scheduler's verdict where it gives one (flush, weight updates:
        ``success``; set_internal_state: ``updated``); else the HTTP status
        once it arrived; None while unknown."""
        verdict = _answer_verdict(self.answer)
        if verdict is not None:
            return verdict
        if self.http.status is not None:
            if isinstance(self.http.body, dict) and "success" in self.http.body:
                return bool(self.http.body["success"])
            return 200 <= self.http.status < 300
        if self.processed:
            return True  # processed and the scheduler has no verdict to give
        return None

    def scheduler_verdict(self) -> Dict[str, Any]:
        """success and message from the scheduler's own reply only (fixed the
        moment the op is processed, unlike the HTTP answer): for the trace."""
        answer = self.answer
        verdict = _answer_verdict(answer)
        success = True if verdict is None else verdict
        message = getattr(answer, "message", None) if answer is not None else None
        return {"success": success, "message": message or None}

    @property
    def message(self) -> Optional[str]:
        if self.answer is not None and getattr(self.answer, "message", None):
            return self.answer.message
        if isinstance(self.http.body, dict):
            return self.http.body.get("message")
        if isinstance(self.http.body, str):
            return self.http.body
        return self.http.error

    def wait(self, *, max_steps: int = 200, http: bool = False):
        """``yield from op.wait()``: step until the scheduler processed the op
        (and, with ``http=True``, until its HTTP answer arrived); returns self."""
        from scripted_runtime.scheduler_side.context.waits import wait_until

        what = f"{self.name} to be processed" + (" and answered over HTTP" if http else "")
        yield from wait_until(
            lambda: self.processed and (not http or self.http.done),
            max_steps=max_steps, what=what, describe=self.describe,
        )
        return self

    def as_dict(self) -> Dict[str, Any]:
        return {
            "op": self.name,
            "rid": self.rid,
            "posted_step": self.posted_step,
            "processed_step": self.processed_step,
            "success": self.success,
            "message": self.message,
            "http_status": self.http.status,
        }

    def __repr__(self) -> str:
        return (
            f"ControlOp({self.name}, posted@{self.posted_step}, "
            f"processed@{self.processed_step}, success={self.success}, "
            f"message={self.message!r})"
        )


def _answer_verdict(answer: Any) -> Optional[bool]:
    """The verdict in a scheduler's reply (``success``; set_internal_state's
    ``updated``), or None when it carries none."""
    for name in ("success", "updated"):
        if answer is not None and hasattr(answer, name):
            return bool(getattr(answer, name))
    return None


def pause_posted_last(ops: List[ControlOp]) -> bool:
    """Whether the last pause/continue among ``ops`` (in posting order) is a
    pause: the tokenizer flags itself paused as it takes the pause's HTTP
    call (and then holds new generate requests and lets weight updates skip
    its writer lock); the scheduler learns of it one iteration later."""
    for op in reversed(ops):
        if op.name.startswith("pause_generation"):
            return True
        if op.name == "continue_generation":
            return False
    return False


class ControlLedger:
    """Matches scheduler-processed control requests to the ops that sent them."""

    def __init__(self, step_counter: Callable[[], int]) -> None:
        self._step = step_counter
        self.ops: List[ControlOp] = []

    def register(self, op: ControlOp) -> ControlOp:
        self.ops.append(op)
        return op

    def clear(self) -> None:
        self.ops.clear()

    def unsettled(self) -> List[ControlOp]:
        """Ops posted and not settled (``ControlOp.settled``): a
        fire-and-forget update_weights_from_disk still behind the tokenizer's
        lock, say, or a pause that reached the scheduler's socket and was
        answered but not processed yet."""
        return [op for op in self.ops if not op.settled]

    def keep_unsettled(self) -> None:
        """Forget every op except the unsettled ones (between scripts: the
        reset waits for those, so they cannot land in the next script)."""
        self.ops = self.unsettled()

    def unprocessed(self, name: str) -> List[ControlOp]:
        """Ops called ``name`` posted but not processed yet."""
        return [op for op in self.ops if op.name == name and not op.processed]

    def unprocessed_of_type(self, request_type: str) -> List[ControlOp]:
        """Ops of scheduler request type ``request_type`` posted and not
        settled (``ControlOp.settled``)."""
        return [op for op in self.ops if op.request_type == request_type and not op.settled]

    def on_arrival(self, obj: Any) -> None:
        op = self._first_open(obj, lambda o: not o.arrived)
        if op is not None:
            op.arrived = True

    def on_processed(self, obj: Any, output: Any) -> None:
        op = self._first_open(obj, lambda o: not o.processed)
        if op is None:
            return
        op.arrived = True
        op.processed_step = self._step()
        op.answer = output

    def _first_open(self, obj: Any, is_open) -> Optional[ControlOp]:
        type_name = type(obj).__name__
        rid = getattr(obj, "rid", None)
        for op in self.ops:
            if op.request_type != type_name or not op.forwarded or not is_open(op):
                continue
            if op.rid is not None and rid is not None and op.rid != rid:
                continue
            return op
        return None

    def log(self) -> List[Dict[str, Any]]:
        return [op.as_dict() for op in self.ops]
