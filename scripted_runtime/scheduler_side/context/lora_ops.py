"""LoRA adapters at run time (part of ``ctx``): ``load_lora_adapter``,
``load_lora_adapter_from_tensors``, ``unload_lora_adapter``, the adapters a
LoRA server offers and the ones loaded. Requests name their adapter with ``ctx.start_req(lora=NAME)``.

Only on a server started with ``--enable-lora`` (the ``pp1-lora``
topology; on CPU the ``torch_native`` backend, hooks/cpu_enablement.py
item 6). What SGLang's tokenizer does first matters for when each reaches
the scheduler (``managers/tokenizer_control_mixin.py``): a load is sent at
once (under the tokenizer's LoRA update lock, one load or unload at a time);
an unload first stops new requests from using the adapter, then **waits
until every request using it has finished**, and only then reaches the
scheduler. Contract ``lora``: docs/checks.md.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Tuple

from scripted_runtime.hooks import sglang_compat
from scripted_runtime.protocol import ENV_LORA_ADAPTERS
from scripted_runtime.scheduler_side import state
from scripted_runtime.scheduler_side.control import ControlOp

LORA_REQUEST_TYPES = ("LoadLoRAAdapterReqInput", "LoadLoRAAdapterFromTensorsReqInput", "UnloadLoRAAdapterReqInput")
LOAD_OP_NAMES = ("load_lora_adapter", "load_lora_adapter_from_tensors")  # op names are NAME(adapter)
LOAD_ANSWER_TIMEOUT_S = 10.0  # the tokenizer registers a load the scheduler answered without further iterations
UNLOAD_ARRIVAL_TIMEOUT_S = 10.0  # an unload whose adapter's requests all finished reaches the scheduler by then


class LoraOps:
    """Mixed into ``ScriptContext`` (which provides ``_control``,
    ``unsettled_ops_of_type``, ``await_arrival`` and ``_scheduler``)."""

    @property
    def lora_adapters(self) -> Dict[str, str]:
        """The adapters this server offers its scripts: name -> folder
        (written by the harness, ``user_side/models/lora_adapters.py``);
        empty on a server without LoRA."""
        return dict(json.loads(os.environ.get(ENV_LORA_ADAPTERS) or "{}"))

    @property
    def loaded_lora_adapters(self) -> Tuple[str, ...]:
        """The names of the adapters the scheduler's LoRA manager holds now, sorted."""
        return sglang_compat.loaded_lora_names(self._scheduler)

    def lora_in_use(self, name: str) -> bool:
        """Whether the scheduler holds an unfinished request served with
        adapter ``name``. SGLang's tokenizer sends an unload on only once no
        request using the adapter is unfinished or unanswered
        (``lora_requests_unanswered``: the last answers follow by the clock)."""
        ids = [lora_id for lora_id, n in sglang_compat.loaded_loras(self._scheduler).items() if n == name]
        return any(getattr(r, "lora_id", None) in ids and not r.finished()
                   for r in state.live_reqs(self._scheduler).values())

    def lora_requests_unanswered(self, name: str) -> List[Any]:
        """This script's requests served with adapter ``name`` whose HTTP
        answer has not come yet (finished at the scheduler and on their way,
        or held by the tokenizer: a pause)."""
        return [h for h in self._tracker.handles
                if getattr(h, "lora", None) == name and h.http is not None and not h.http.done]

    def settle_lora_ops(self, max_steps: int):
        """``yield from ctx.settle_lora_ops(max_steps)``: until no LoRA load
        or unload of this script is unsettled (SGLang's tokenizer sends one
        at a time); True when none is. It steps only while a pending unload's
        adapter still serves an unfinished request (at most ``max_steps``
        iterations); once none does, the tokenizer sends the unload on by
        itself, which is waited for by the clock without stepping
        (``await_arrival``), so the steps never depend on the tokenizer's
        timing."""
        for _ in range(max_steps):
            pending = [op for t in LORA_REQUEST_TYPES for op in self.unsettled_ops_of_type(t)]
            if not pending:
                return True
            op = pending[0]
            name = (op.payload or {}).get("lora_name")
            if not op.arrived and not (name and self.lora_in_use(name)):
                if not self.await_arrival(op, UNLOAD_ARRIVAL_TIMEOUT_S):
                    return False
            yield
        return not any(self.unsettled_ops_of_type(t) for t in LORA_REQUEST_TYPES)

    def lora_held(self, name: str, *, max_steps: int):
        """``yield from ctx.lora_held(name, max_steps=N)``: whether the
        scheduler holds adapter ``name`` after this script's pending LoRA
        updates settled (``settle_lora_ops``) and, if it did not hold it, a
        load was processed. False when they do not settle within
        ``max_steps`` or the load is refused."""
        if not (yield from self.settle_lora_ops(max_steps)):
            return False
        if name not in self.loaded_lora_adapters:
            op = self.load_lora_adapter(name)
            yield from op.wait()
        return name in self.loaded_lora_adapters

    def _refuse_lora_op(self, what: str) -> None:
        if not sglang_compat.lora_enabled(self._scheduler):
            raise RuntimeError(f"{what}: LoRA is not enabled on this server (start it with --enable-lora, e.g. the "
                               "pp1-lora topology: scripted-runtime run --sglang-arg enable_lora=true ...)")
        for request_type in LORA_REQUEST_TYPES:
            pending = self.unsettled_ops_of_type(request_type)
            if pending:
                raise RuntimeError(
                    f"{what}: {pending[0].name} posted at step {pending[0].posted_step} has not been processed yet, "
                    "and SGLang's tokenizer sends one LoRA load or unload at a time (under its LoRA update lock, "
                    "until the scheduler answered), so this one could not reach the scheduler; "
                    "`yield from op.wait()` first")

    def _lora_ready_for_request(self, name: str) -> None:
        """Before a request names adapter ``name``: the scheduler holds it,
        and the tokenizer registered it (a load is registered when its
        answer comes back, after the scheduler processed it: waited for
        here, a bounded wall-clock wait). Else SGLang's tokenizer would load
        it again on its own before sending the request on, a load that needs
        scheduler iterations while this script holds the scheduler frozen:
        that raises at once instead."""
        if not sglang_compat.lora_enabled(self._scheduler):
            raise RuntimeError(f"start_req(lora={name!r}): LoRA is not enabled on this server (start it with "
                               "--enable-lora, e.g. the pp1-lora topology)")
        if name not in self.loaded_lora_adapters:
            raise RuntimeError(f"start_req(lora={name!r}): the scheduler does not hold that adapter (loaded: "
                               f"{', '.join(self.loaded_lora_adapters) or 'none'}); SGLang's tokenizer would load it "
                               "itself before the request, which the frozen scheduler cannot answer: "
                               f"ctx.load_lora_adapter({name!r}) and `yield from op.wait()` first")
        unloading = [op for op in self.unsettled_ops_of_type("UnloadLoRAAdapterReqInput")
                     if op.name == f"unload_lora_adapter({name!r})"]
        if unloading:
            raise RuntimeError(f"start_req(lora={name!r}): the unload of that adapter posted at step "
                               f"{unloading[0].posted_step} is still pending (SGLang's tokenizer sends it once the "
                               "adapter's requests finished); the tokenizer would hold this request until then and "
                               "load the adapter again itself, which the frozen scheduler cannot answer: "
                               "`yield from op.wait()` on the unload, then load it again")
        loads = [op for op in self.control_ops if op.name in {f"{kind}({name!r})" for kind in LOAD_OP_NAMES}]
        if loads and not loads[-1].http.wait(LOAD_ANSWER_TIMEOUT_S):
            raise RuntimeError(f"start_req(lora={name!r}): the load of the adapter was processed at step "
                               f"{loads[-1].processed_step} but not answered over HTTP within "
                               f"{LOAD_ANSWER_TIMEOUT_S:.0f}s (SGLang's tokenizer registers it on that answer)")

    def _offered_folder(self, what: str, name: str, argument: str) -> str:
        """The folder of the harness's adapter ``name``; a one-line
        ``ValueError`` naming ``what`` and the ``argument`` to pass when the
        harness offers none of that name."""
        offered = self.lora_adapters
        if name not in offered:
            raise ValueError(f"{what}: no adapter of that name here (offered: "
                             f"{', '.join(sorted(offered)) or 'none'}); pass {argument}=FOLDER")
        return offered[name]

    def load_lora_adapter(self, name: str, path: Optional[str] = None, *, pinned: bool = False) -> ControlOp:
        """POST ``/load_lora_adapter``: load adapter ``name`` from ``path``
        (default: the harness's adapter of that name, ``ctx.lora_adapters``).
        Returns once it reached the scheduler; ``op.success`` after the next
        iteration. SGLang refuses a name already loaded."""
        self._refuse_lora_op(f"load_lora_adapter({name!r})")
        if path is None:
            path = self._offered_folder(f"load_lora_adapter({name!r})", name, "path")
        return self._control(f"load_lora_adapter({name!r})", "/load_lora_adapter",
                             {"lora_name": name, "lora_path": path, "pinned": pinned}, "LoadLoRAAdapterReqInput")

    def load_lora_adapter_from_tensors(self, name: str, folder: Optional[str] = None, *,
                                       pinned: bool = False) -> ControlOp:
        """POST ``/load_lora_adapter_from_tensors``: load adapter ``name``
        from its tensors and config (the RL trainer's path), read here from
        ``folder`` (default: the harness's adapter of that name,
        ``ctx.lora_adapters``: its ``adapter_model.safetensors`` and
        ``adapter_config.json``) and sent as SGLang's
        ``MultiprocessingSerializer`` payload, one copy per TP rank (on CPU,
        shared-memory handles of tensors this process holds, kept alive on
        the op until SGLang loaded them, as ``update_weights_from_tensor``).
        Returns once it reached the scheduler; ``op.success`` after the next
        iteration. SGLang refuses a name already loaded. The output oracle
        compares a request served with it against the references of the
        folder's adapter, so the tensors must serve what the files do."""
        self._refuse_lora_op(f"load_lora_adapter_from_tensors({name!r})")
        refused = sglang_compat.cpu_tensor_update_supported(self._scheduler, "load_lora_adapter_from_tensors")
        if refused:
            raise RuntimeError(refused)
        if folder is None:
            folder = self._offered_folder(f"load_lora_adapter_from_tensors({name!r})", name, "folder")
        from safetensors.torch import load_file

        tensors = load_file(os.path.join(folder, "adapter_model.safetensors"))
        with open(os.path.join(folder, "adapter_config.json")) as f:
            config = json.load(f)
        payload = {"lora_name": name, "config_dict": config, "pinned": pinned,
                   "serialized_named_tensors": sglang_compat.serialize_named_tensors(self._scheduler, tensors)}
        op = self._control(f"load_lora_adapter_from_tensors({name!r})", "/load_lora_adapter_from_tensors", payload,
                           "LoadLoRAAdapterFromTensorsReqInput")
        op.payload = {"lora_name": name, "tensors": len(tensors)}  # not the handles
        op.keep_alive = tensors  # the shared memory the handles name, until SGLang loaded it
        return op

    def unload_lora_adapter(self, name: str) -> ControlOp:
        """POST ``/unload_lora_adapter``: SGLang's tokenizer stops new
        requests from using ``name`` at once, and sends the unload to the
        scheduler only after every request using it has finished, so this
        returns before it arrived: ``yield from op.wait()`` steps until it
        was processed."""
        self._refuse_lora_op(f"unload_lora_adapter({name!r})")
        return self._control(f"unload_lora_adapter({name!r})", "/unload_lora_adapter", {"lora_name": name},
                             "UnloadLoRAAdapterReqInput", await_arrival=False)
