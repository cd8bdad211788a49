"""The actions an explored program is made of, and the Python source they
compile to.

A program is a list of actions. It is never interpreted: ``to_source``
turns it into a plain scenario function (``def program(ctx): ...``) over
the public context API and the helpers in
``scheduler_side/explore/program.py``, and that
source is what runs in the scheduler, what a failure is written out as, and
what ``scripted-runtime run`` replays. One text, so the written file cannot
drift from what was explored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

from scripted_runtime.scheduler_side.explore.interpreter import PROGRAM_FUNCTION

CHUNK_TOKENS = 64  # engine_config.COMMON["chunked_prefill_size"]
# Bump when an action's meaning or fields change: stored failing programs
# (``failure_db``) are keyed by it, so an old program is never replayed as a new one.
GRAMMAR_VERSION = 1


@dataclass(frozen=True)
class Steps:
    n: int

    def describe(self) -> str:
        return f"step {self.n}"


@dataclass(frozen=True)
class Start:
    prompt_len: int
    token: int  # requests with the same token share a prefix (radix hits)
    max_new_tokens: int

    def describe(self) -> str:
        chunks = -(-self.prompt_len // CHUNK_TOKENS)
        return (f"start: {self.prompt_len} x token {self.token} ({chunks} chunk{'s' if chunks > 1 else ''}), "
                f"{self.max_new_tokens} new")


@dataclass(frozen=True)
class Flush:
    def describe(self) -> str:
        return "flush_cache"


@dataclass(frozen=True)
class UpdateWeights:
    flush: bool

    def describe(self) -> str:
        return f"update_weights_from_disk(flush_cache={self.flush})"


@dataclass(frozen=True)
class Pause:
    mode: str  # "in_place" | "retract"

    def describe(self) -> str:
        return f"pause_generation({self.mode})"


@dataclass(frozen=True)
class Continue:
    def describe(self) -> str:
        return "continue_generation"


@dataclass(frozen=True)
class AbortOne:
    pick: int  # index into the live requests, modulo their number

    def describe(self) -> str:
        return f"abort one live request (#{self.pick})"


@dataclass(frozen=True)
class AbortAll:
    def describe(self) -> str:
        return "abort_all"


Op = Union[Flush, UpdateWeights, Pause, Continue, AbortOne, AbortAll]


@dataclass(frozen=True)
class OnWindow:
    window: str
    op: Op
    max_steps: int

    def describe(self) -> str:
        return f"when {self.window} opens (within {self.max_steps} steps): {self.op.describe()}"


@dataclass(frozen=True)
class Extension:
    """An explorer action a user's module registers (``scripted_runtime/extensions.py``)."""

    name: str

    def describe(self) -> str:
        return f"{self.name} (extension action)"


@dataclass(frozen=True)
class HoldTransfers:
    """Hold HiCache's copies from now on (``hooks/hicache_gate.py``); drawn
    only on a topology with HiCache on."""

    loads: bool
    backups: bool

    def describe(self) -> str:
        what = " and ".join(k for k, on in (("loads", self.loads), ("backups", self.backups)) if on) or "nothing"
        return f"hold HiCache {what}"


@dataclass(frozen=True)
class ReleaseTransfers:
    def describe(self) -> str:
        return "release held HiCache transfers"


Action = Union[Steps, Start, Flush, UpdateWeights, Pause, Continue, AbortOne, AbortAll, OnWindow, Extension,
               HoldTransfers, ReleaseTransfers]


def _op_lines(op: Op) -> List[str]:
    if isinstance(op, Flush):
        return ["yield from explore.flush_cache(ctx)"]
    if isinstance(op, UpdateWeights):
        return [f"yield from explore.update_weights(ctx, reqs, flush_cache={op.flush})"]
    if isinstance(op, Pause):
        return [f"ctx.pause_generation({op.mode!r})"]
    if isinstance(op, Continue):
        return ["ctx.continue_generation()"]
    if isinstance(op, AbortOne):
        return [f"explore.abort_one(ctx, reqs, {op.pick})"]
    if isinstance(op, AbortAll):
        return ["ctx.abort_all()"]
    raise TypeError(f"not a control operation: {op!r}")


def _pauses(action: Action) -> bool:
    op = action.op if isinstance(action, OnWindow) else action
    return isinstance(op, Pause)


@dataclass
class Source:
    """A program's source and the line range (1-based, inclusive) of each action."""

    text: str
    action_lines: List[Tuple[int, int]]

    def action_at(self, line: int) -> Optional[int]:
        for i, (lo, hi) in enumerate(self.action_lines):
            if lo <= line <= hi:
                return i
        return None


def to_source(actions: Sequence[Action], *, docstring: str = "", mark: Optional[Dict[int, str]] = None,
              function: str = PROGRAM_FUNCTION) -> Source:
    """The scenario source of ``actions``. ``mark`` maps an action index to a
    comment put after that action's lines (the failing step); index -1 marks
    the end-state checks."""
    mark = mark or {}
    head = []
    if docstring:
        head += ('"""' + docstring.replace('"""', "'''").rstrip() + "\n" + '"""').splitlines()
    head += [
        "from scripted_runtime.scheduler_side.explore import program as explore",
        "",
        "",
        f"def {function}(ctx):",
        "    reqs = []",
    ]
    lines = list(head)
    ranges: List[Tuple[int, int]] = []
    may_be_paused = False
    for i, action in enumerate(actions):
        lines.append(f"    # {i + 1}. {action.describe()}")
        first = len(lines) + 1
        body: List[str]
        if isinstance(action, Steps):
            body = [f"yield from ctx.steps({action.n})"]
        elif isinstance(action, Start):
            call = (f"reqs.append(ctx.start_req(input_ids=[{action.token}] * {action.prompt_len}, "
                    f"max_new_tokens={action.max_new_tokens}, ignore_eos=True, temperature=0.0))")
            # The tokenizer holds new requests for the whole pause.
            body = ["if not explore.tokenizer_paused(ctx):", "    " + call] if may_be_paused else [call]
        elif isinstance(action, Extension):
            body = [f"yield from explore.extension_action(ctx, reqs, {action.name!r})"]
        elif isinstance(action, HoldTransfers):
            body = [f"explore.hold_transfers(ctx, loads={action.loads}, backups={action.backups})"]
        elif isinstance(action, ReleaseTransfers):
            body = ["explore.release_transfers(ctx)"]
        elif isinstance(action, OnWindow):
            body = [f"if (yield from ctx.wait_for_window({action.window!r}, max_steps={action.max_steps}, "
                    "required=False)):"] + ["    " + l for l in _op_lines(action.op)]
        else:
            body = _op_lines(action)
        lines += ["    " + l for l in body]
        if i in mark:
            lines[-1] += f"  # <-- {mark[i]}"
        ranges.append((first, len(lines)))
        may_be_paused = may_be_paused or _pauses(action)
    lines.append("    # end: every request finishes or is aborted, the engine returns to idle")
    lines.append("    return (yield from explore.end_state_checks(ctx, reqs))"
                 + (f"  # <-- {mark[-1]}" if -1 in mark else ""))
    return Source("\n".join(lines) + "\n", ranges)
