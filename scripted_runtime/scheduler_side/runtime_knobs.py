"""The runtime knobs a script may turn (``ctx.set_internal_state``,
``ctx.slow_down``, ``ctx.update_weight_version``, ``ctx.configure_logging``,
``ctx.start_profile``, ``ctx.load_lora_adapter``), the weight-update
session, the sessions and the weight-update process groups it may leave
open (``ctx.begin_weight_update``, ``ctx.open_session``,
``ctx.init_weights_update_group``), and how the reset turns them back (scheduler
process, driver rank).

A knob changes what every later script sees (how many requests a batch
admits, the served version label), so the reset fingerprint holds them
(``reset_fingerprint``) and the reset puts back the values of the engine as
it came up, through SGLang's own routes: each is relayed to every PP rank
like the script's was.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from scripted_runtime.hooks import sglang_compat

LIMIT = "micro-batch limit (set_internal_state)"
SLEEP = "forward_sleep_time (slow_down)"
VERSION = "weight version (update_weight_version)"
SESSION = "weight-update session open (begin_weight_update)"
SESSIONS = "open sessions (open_session)"
LORAS = "LoRA adapters loaded (load_lora_adapter)"
PROFILING = "torch profiler running (start_profile)"
LOG_LEVEL = "log level (configure_logging)"
GROUPS = "weight-update process groups (init_weights_update_group)"


def take(s: Any) -> Dict[str, Any]:
    """The knobs' values now (part of the reset fingerprint)."""
    return {LIMIT: sglang_compat.micro_batch_limit(s), SLEEP: sglang_compat.forward_sleep_time(s),
            VERSION: sglang_compat.served_weight_version(), SESSION: sglang_compat.weight_update_session_open(s),
            SESSIONS: sglang_compat.open_sessions(s), LORAS: sglang_compat.loaded_lora_names(s),
            PROFILING: sglang_compat.profiler_state(s)["in_progress"], LOG_LEVEL: sglang_compat.root_log_level(),
            GROUPS: sglang_compat.weight_update_groups(s)}


def restore(ctx: Any, fresh: Dict[str, Any], now: Optional[Dict[str, Any]] = None) -> List[Any]:
    """Post what turns every knob that differs from ``fresh`` (a fingerprint
    of the engine as it came up) back; returns the ops posted (processed in
    the next iteration). ``now``: ``take`` of the engine now, when the caller
    has it. LoRA adapters a script loaded are unloaded one per call
    (SGLang's tokenizer sends one LoRA update at a time): the reset calls
    this again until it posts nothing."""
    if now is None:
        now = take(ctx.scheduler)
    ops = []
    if LIMIT in fresh and now[LIMIT] != fresh[LIMIT] and fresh[LIMIT] is not None:
        ops.append(ctx.set_internal_state(**{sglang_compat.MICRO_BATCH_KNOB: fresh[LIMIT]}))
    if SLEEP in fresh and now[SLEEP] != fresh[SLEEP]:
        ops.append(ctx.slow_down(fresh[SLEEP]))
    if VERSION in fresh and now[VERSION] != fresh[VERSION] and fresh[VERSION] is not None:
        ops.append(ctx.update_weight_version(fresh[VERSION]))
    if now[SESSION] and not fresh.get(SESSION):
        ops.append(ctx.end_weight_update())  # a session a script left open refuses the next begin
    for session_id in now[SESSIONS]:
        if session_id not in fresh.get(SESSIONS, ()):
            ops.append(ctx.close_session(session_id))  # its id would be refused by the next open
    if now[PROFILING] and not fresh.get(PROFILING):
        ops.append(ctx.stop_profile())  # a running profile refuses the next start
    if LOG_LEVEL in fresh and now[LOG_LEVEL] != fresh[LOG_LEVEL]:
        ops.append(ctx.configure_logging(fresh[LOG_LEVEL]))
    for group in now.get(GROUPS, ()):
        if group not in fresh.get(GROUPS, ()):
            ops.append(ctx.destroy_weights_update_group(group))  # a joined name is refused by the next init
    extra = [name for name in now[LORAS] if name not in fresh.get(LORAS, ())]
    if extra:
        ops.append(ctx.unload_lora_adapter(extra[0]))  # a name loaded is refused by the next load
    return ops
