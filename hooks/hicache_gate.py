"""The HiCache transfer gate: lets a script hold SGLang's host<->device KV
copies (0.5.23's ``L2TransferEngine``) pending across scheduler iterations,
and records what the checks of ``scheduler_side/hicache_checks.py`` need.

Why: without a storage backend every HiCache copy runs synchronously on the
scheduler thread, inside ``start_loading`` / ``start_writing``, and is reaped
at the start of the next iteration (docs/sglang-facts.md, "HiCache on CPU").
On a GPU the same copies run on their own streams while the scheduler moves
on. Holding a copy here reproduces that: the copy itself is deferred, not
only its acknowledgement, so a forward can run before a load's data arrived.

A transfer's life (``Transfer.state``):

* ``held``: submitted while the gate holds its kind; nothing copied yet; its
  completion event reports not done (``query()`` False), so SGLang keeps it
  in ``ack_*_queue`` / ``ongoing_*`` and the node locked.
* ``copied``: the data moved, the completion is still pending. A held load
  is copied when a forward waits on its layer event (SGLang's
  ``LayerDoneCounter.wait_until`` from ``get_key_buffer``: on a GPU the
  forward's stream would wait for the copy, so running the copy there is
  what the GPU orders), and the wait is recorded.
* ``released``: the completion is visible; SGLang reaps it at its next poll.
  ``release()`` (the script, or the reset between scripts) copies what is
  still held and releases; a blocking ``synchronize()`` by SGLang does too.

Not held (the default), a transfer is copied and released at submit, exactly
as 0.5.23 does; it is still recorded until SGLang reaps it, for the
``hicache_transfer_slots`` check. Per process: on pp>1 the gate of the
driver rank (rank 0) is the one a script controls; the other ranks' copies
run unheld, and rank 0's ack count is what every rank reaps by.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from scripted_runtime.hooks import post_import

logger = logging.getLogger("scripted_runtime.hooks")

L2_TRANSFER = "sglang.srt.mem_cache.l2_transfer"
CACHE_CONTROLLER = "sglang.srt.managers.cache_controller"
KINDS = ("load", "backup")
# Released transfers are forgotten once SGLang reaped them (``forget_reaped``,
# run by the checks); where nothing runs it (checks off, a rank without the
# script driver) the record is bounded: past this many, only the newest
# KEEP_RELEASED released ones are kept (SGLang reaps within an iteration or two).
MAX_RECORDED = 256
KEEP_RELEASED = 64


class GateEvent:
    """The completion event SGLang gets for a held transfer: not done until
    the gate releases it; a blocking wait releases it (the copy finishes)."""

    def __init__(self, transfer: "Transfer") -> None:
        self._transfer = transfer

    def query(self) -> bool:
        return self._transfer.state == "released"

    def synchronize(self) -> None:
        if self._transfer.state != "released":
            self._transfer.gate.release_one(self._transfer, why="synchronize")

    def record(self, *args: Any, **kwargs: Any) -> None:
        return None

    def wait(self, *args: Any, **kwargs: Any) -> None:
        return None

    def elapsed_time(self, other: Any) -> float:
        return 0.0


@dataclass
class Transfer:
    gate: "TransferGate"
    seq: int
    kind: str  # "load" (host->device) or "backup" (device->host)
    device_indices: Any  # the device KV slots it writes (load) or reads (backup)
    host_indices: Any
    run: Optional[Callable[[], Any]]  # the deferred copy (None once run)
    state: str = "held"
    layer_event: Any = None  # a load's LayerLoadingEvent (what a consumer waits on)
    born: int = 0  # the gate's clock (scheduler iteration) at submit
    waited: bool = False  # a forward waited on it (and so copied it)
    completion: Any = None  # SGLang's TransferCompletion as returned by submit
    notes: List[str] = field(default_factory=list)

    def describe(self) -> Dict[str, Any]:
        return {"seq": self.seq, "kind": self.kind, "state": self.state,
                "tokens": int(self.device_indices.numel()), "waited": self.waited}


class TransferGate:
    """Which kinds are held, and every transfer not yet reaped by SGLang."""

    def __init__(self) -> None:
        self.holding = {kind: False for kind in KINDS}
        # A held transfer is released by itself this many iterations after
        # submit (a slow copy still finishes); None: only when released.
        self.max_iterations: Optional[int] = None
        self.clock = 0  # scheduler iterations, advanced by the driver (tick)
        self.transfers: List[Transfer] = []
        self._seq = 0
        # Forwards that read device slots of a load still held (nothing
        # copied) and did not wait on it: (step, batch description, slots).
        self.unwaited_reads: List[Dict[str, Any]] = []

    # --- the script's side ------------------------------------------------------
    def hold(self, loads: bool = True, backups: bool = False, max_iterations: Optional[int] = None) -> None:
        if max_iterations is not None and max_iterations < 1:
            raise ValueError(f"max_iterations must be >= 1 or None, got {max_iterations}")
        self.holding["load"] = bool(loads)
        self.holding["backup"] = bool(backups)
        self.max_iterations = max_iterations

    def tick(self, clock: int) -> None:
        """A new scheduler iteration: release what was held ``max_iterations``."""
        self.clock = clock
        if self.max_iterations is None or not self.transfers:
            return
        for t in self.transfers:
            if t.state != "released" and clock - t.born >= self.max_iterations:
                self.release_one(t, why="max_iterations")

    def release(self, kind: Optional[str] = None) -> int:
        """Copy what is held (of ``kind``, or all) and make every pending
        completion visible; holding stops for that kind. Returns how many
        transfers were released."""
        if kind is not None and kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS} or None, got {kind!r}")
        n = 0
        for t in list(self.transfers):
            if t.state != "released" and (kind is None or t.kind == kind):
                self.release_one(t, why="release")
                n += 1
        for k in KINDS:
            if kind is None or k == kind:
                self.holding[k] = False
        return n

    def reset(self) -> None:
        """Between scripts: release everything and hold nothing (the
        released transfers are forgotten once SGLang reaps them)."""
        self.release()
        self.max_iterations = None
        self.unwaited_reads.clear()

    # --- views ------------------------------------------------------------------
    def counts(self) -> Dict[str, int]:
        out = {"held_loads": 0, "held_backups": 0, "copied_unreleased": 0}
        for t in self.transfers:
            if t.state == "held":
                out["held_loads" if t.kind == "load" else "held_backups"] += 1
            elif t.state == "copied":
                out["copied_unreleased"] += 1
        return out

    def forget_reaped(self, still_queued: Callable[[Transfer], bool]) -> None:
        """Drop the released transfers SGLang no longer holds an ack for."""
        self.transfers = [t for t in self.transfers if t.state != "released" or still_queued(t)]

    # --- SGLang's side --------------------------------------------------------------
    def submit(self, kind: str, device_indices: Any, host_indices: Any, run: Callable[[], Any],
               layer_event: Any = None) -> Transfer:
        self._seq += 1
        if len(self.transfers) >= MAX_RECORDED:
            released = [t for t in self.transfers if t.state == "released"]
            old = {id(t) for t in released[:-KEEP_RELEASED]}
            self.transfers = [t for t in self.transfers if id(t) not in old]
        t = Transfer(self, self._seq, kind, device_indices, host_indices, run, layer_event=layer_event,
                     born=self.clock)
        self.transfers.append(t)
        if not self.holding[kind]:
            self.release_one(t, why="unheld")
        return t

    def copy(self, t: Transfer) -> None:
        if t.run is None:
            return
        run, t.run = t.run, None
        run()
        t.state = "copied"

    def release_one(self, t: Transfer, why: str) -> None:
        self.copy(t)
        t.state = "released"
        t.notes.append(why)

    def consumer_waits(self, layer_event: Any) -> None:
        """A forward waits on ``layer_event``: the held load feeding it is
        copied now (on a GPU its stream would wait for the copy)."""
        for t in self.transfers:
            if t.kind == "load" and t.layer_event is layer_event and t.state == "held":
                t.waited = True
                self.copy(t)


_gate = TransferGate()


def gate() -> TransferGate:
    """This process's gate."""
    return _gate


# --- the patches ---------------------------------------------------------------------

def _cat_indices(transfers: List[Any], name: str) -> Any:
    import torch

    parts = [getattr(t, name) for t in transfers if getattr(t, name, None) is not None]
    if not parts:
        return torch.empty(0, dtype=torch.int64)
    return torch.cat([p.reshape(-1).to("cpu", torch.int64) for p in parts])


def _patch_engine(module: Any) -> None:
    engine_cls = getattr(module, "L2TransferEngine", None)
    completion_cls = getattr(module, "TransferCompletion", None)
    if engine_cls is None or completion_cls is None:
        logger.warning("HiCache gate: %s has no L2TransferEngine/TransferCompletion; the gate is off",
                       module.__name__)
        return
    original_h2d = engine_cls.submit_host_to_device
    original_d2h = engine_cls.submit_device_to_host

    @functools.wraps(original_h2d)
    def submit_host_to_device(self, transfers, *args, **kwargs):
        on_layer_done = kwargs.get("on_layer_done")
        layer_event = getattr(on_layer_done, "__self__", None)
        return _gated("load", transfers, lambda: original_h2d(self, transfers, *args, **kwargs),
                      completion_cls, layer_event)

    @functools.wraps(original_d2h)
    def submit_device_to_host(self, transfers, *args, **kwargs):
        return _gated("backup", transfers, lambda: original_d2h(self, transfers, *args, **kwargs),
                      completion_cls, None)

    engine_cls.submit_host_to_device = submit_host_to_device
    engine_cls.submit_device_to_host = submit_device_to_host


def _gated(kind: str, transfers: List[Any], run: Callable[[], Any], completion_cls: Any,
           layer_event: Any) -> Any:
    g = _gate
    device = _cat_indices(transfers, "device_indices")
    host = _cat_indices(transfers, "host_indices")
    if not g.holding[kind]:
        completion = run()  # SGLang's own path, untouched
        t = g.submit(kind, device, host, lambda: completion, layer_event)
        t.completion = completion
        return completion
    t = g.submit(kind, device, host, run, layer_event)
    event = GateEvent(t)
    t.completion = completion_cls(event, event, False)
    return t.completion


def _patch_layer_wait(module: Any) -> None:
    event_cls = getattr(module, "LayerLoadingEvent", None)
    if event_cls is None:
        logger.warning("HiCache gate: %s has no LayerLoadingEvent; a consumer's wait cannot copy a held load",
                       module.__name__)
        return
    original_wait = event_cls.wait

    @functools.wraps(original_wait)
    def wait(self, layer_index):
        if _gate.transfers:
            _gate.consumer_waits(self)
        return original_wait(self, layer_index)

    event_cls.wait = wait


def _batch_reads(batch: Any, loads: List[Transfer]) -> List[Any]:
    """(transfer, rid, slots) for each request of ``batch`` whose KV slots
    (its ``req_to_token`` row up to its sequence length: what the forward's
    attention reads) meet a held load's device slots."""
    import torch

    reqs = list(getattr(batch, "reqs", None) or ())
    pool = getattr(batch, "req_to_token_pool", None)
    lens = getattr(batch, "seq_lens_cpu", None)
    if lens is None:
        lens = getattr(batch, "seq_lens", None)
    if not reqs or pool is None or lens is None:
        return []
    lens = lens.tolist() if hasattr(lens, "tolist") else list(lens)
    rows = getattr(batch, "req_pool_indices", None)
    if rows is not None:
        rows = rows.tolist()
    else:
        from scripted_runtime.scheduler_side import state

        rows = [state.req_pool_idx(r) for r in reqs]
    out = []
    for req, row, n in zip(reqs, rows, lens):
        if row is None or n <= 0:
            continue
        slots = pool.req_to_token[row, : int(n)].to("cpu", torch.int64)
        for t in loads:
            hit = slots[torch.isin(slots, t.device_indices)]
            if hit.numel():
                out.append((t, req.rid, hit))
    return out


def _patch_run_batch(scheduler_module: Any) -> None:
    scheduler_cls = scheduler_module.Scheduler
    original = scheduler_cls.run_batch

    @functools.wraps(original)
    def run_batch(self, batch, *args, **kwargs):
        held = [t for t in _gate.transfers if t.kind == "load" and t.state == "held"] if _gate.transfers else None
        if not held:
            return original(self, batch, *args, **kwargs)
        reads = _batch_reads(batch, held)
        result = original(self, batch, *args, **kwargs)
        mode = getattr(getattr(batch, "forward_mode", None), "name", "?")
        for t, rid, slots in reads:
            if t.state == "held":  # the forward ran; the load it reads from has copied nothing yet
                _gate.unwaited_reads.append({
                    "transfer": t.seq, "rid": rid, "mode": str(mode).lower(), "slots": slots[:6].tolist(),
                    "n_slots": int(slots.numel()),
                    "consumer_index": getattr(batch, "hicache_consumer_index", None)})
        return result

    scheduler_cls.run_batch = run_batch


def install(scheduler_module_name: str) -> None:
    post_import.when_imported(L2_TRANSFER, _patch_engine)
    post_import.when_imported(CACHE_CONTROLLER, _patch_layer_wait)
    post_import.when_imported(scheduler_module_name, _patch_run_batch)
