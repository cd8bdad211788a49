"""Request-field fuzzing: the field cases a fuzzed ``/generate`` request is
made of, the payload they build, and the survival contract that judges its
answer (issue 38).

A fuzzed request is a well-formed base request (a prompt of the explorer's
families, a few new tokens, ``temperature=1`` with a fixed ``sampling_seed``
so it is deterministic, ``ignore_eos``) with one or more **field cases**
applied on top. Each case names one field, one value and the value's
**class**, read off SGLang's own validation (``SamplingParams.verify`` and
``TokenizerManager._validate_one_request`` in 0.5.23):

* ``valid``: SGLang documents the value as allowed (an edge of its range
  included): the request must be **served** (HTTP 200, an answer).
* ``refused``: SGLang documents the value as invalid (its validation raises
  for it): the request must be **refused cleanly** (HTTP 4xx with a
  message, or an abort answer naming the reason).
* ``unchecked``: SGLang's validation says nothing (a stop token past the
  vocabulary, a ``top_logprobs_num`` past it): either answer is fine, only
  survival is judged.

Whatever the class, the **survival contract** holds for every fuzzed
request: it ends with an answer (never a dead scheduler, never a hang past
its deadline, never a 5xx or a dropped connection), the engine is whole
after it (the end-state checks), and the next well-formed request is served
(``program.end_state_checks``). A value is written symbolically (``"V"``,
the vocabulary size; ``"C"``, the context length; ``"L"``, the scheduler's
``max_req_input_len``; ``"P"``, the prompt's length as the earlier cases
left it; ``"B"``, the base prompt's length; ``"N"``, the request's
``max_new_tokens``) and resolved in the
scheduler, so a written scenario holds on any model.

Pure except ``resolve_limits`` (reads the scheduler's model config).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple


NAME = "request_survival"

VALID, REFUSED, UNCHECKED = "valid", "refused", "unchecked"
CLASSES = (VALID, REFUSED, UNCHECKED)


class SurvivalError(AssertionError):
    """A fuzzed request was not answered cleanly, or the server did not serve
    the next well-formed request after it."""


# The base request every case is applied to (besides the prompt and max_new_tokens).
BASE_SAMPLING: Dict[str, Any] = {"temperature": 1.0, "sampling_seed": 0, "ignore_eos": True}


@dataclass(frozen=True)
class FieldCase:
    """One field set to one value. ``field``: a top-level ``/generate`` field
    or ``sampling_params.NAME``; ``value``: a JSON value, or a symbolic
    expression over V, C, L, P, B, N (``expr``, see the module docstring)
    resolved per request. ``why``: the
    SGLang rule the class is read off."""

    name: str
    field: str
    cls: str
    value: Any = None
    expr: Optional[str] = None
    why: str = ""
    # Set on the prompt: the value is a whole prompt (token ids), built from ``expr`` (its
    # token) and ``length`` (an expression: its length).
    length: Optional[str] = None
    # Also sets these fields (a case that needs another one on to mean anything: logprobs).
    with_fields: Tuple[Tuple[str, Any], ...] = ()
    # The registered SGLang bug (``scripted_runtime/known_bugs.py``) this case meets, if any.
    known_bug: str = ""
    # Cases that make SGLang ignore this one's value (it is then valid whatever it is).
    moot_with: Tuple[str, ...] = ()


def _eval(expr: str, limits: Dict[str, int]) -> int:
    """An integer expression over V, C, L, P, B, N (``+``, ``-``, ``*``, ``**``, numbers). Pure."""
    allowed = set("VCLPBN0123456789+-* ()")
    if not set(expr) <= allowed:
        raise ValueError(f"field-case expression {expr!r} may use only V, C, L, P, B, N, numbers and + - * **")
    return int(eval(expr, {"__builtins__": {}}, dict(limits)))  # noqa: S307 - checked above


def _case(name, field, cls, value=None, *, expr=None, why="", length=None, with_fields=(), known_bug="",
          moot_with=()) -> FieldCase:
    return FieldCase(name, field, cls, value, expr, why, length, tuple(with_fields), known_bug, tuple(moot_with))


_VERIFY = "SamplingParams.verify"
_LENGTHS = "TokenizerManager._validate_one_request"
# Simplest first within a field (Hypothesis shrinks towards the first case), valid before invalid.
CASES: Tuple[FieldCase, ...] = (
    # --- the prompt ---------------------------------------------------------
    _case("ids_token_zero", "input_ids", VALID, expr="0", length="B", why="token 0 is in the vocabulary"),
    _case("ids_last_token", "input_ids", VALID, expr="V - 1", length="B", why="V - 1 is in the vocabulary"),
    _case("ids_at_input_limit", "input_ids", VALID, expr="1", length="L - 1",
          with_fields=(("sampling_params.max_new_tokens", 1),),
          why="Scheduler: a prompt shorter than max_req_input_len is taken (validate_input_length); "
              "with one new token it fits the context too"),
    _case("ids_past_input_limit", "input_ids", REFUSED, expr="1", length="L",
          with_fields=(("sampling_params.max_new_tokens", 1),),
          why="Scheduler (validate_input_length): a prompt of max_req_input_len tokens or more is aborted "
              "with a message"),
    _case("ids_past_context", "input_ids", REFUSED, expr="1", length="C",
          why=f"{_LENGTHS}: a prompt of the context length or more is refused"),
    _case("ids_empty", "input_ids", UNCHECKED, value=[], why="no rule in 0.5.23 names an empty prompt"),
    _case("ids_past_vocab", "input_ids", REFUSED, expr="V", length="B",
          why="an id past the vocabulary has no embedding (token_ids_logprob's ids are checked against "
              "it; a prompt's are not: known bug prompt_token_out_of_vocab)",
          known_bug="prompt_token_out_of_vocab"),
    _case("ids_negative", "input_ids", REFUSED, expr="-1", length="B",
          why="a negative id has no embedding (known bug prompt_token_out_of_vocab)",
          known_bug="prompt_token_out_of_vocab"),
    # --- how long ------------------------------------------------------------
    _case("new_zero", "sampling_params.max_new_tokens", VALID, 0, why=f"{_VERIFY}: max_new_tokens >= 0"),
    _case("new_one", "sampling_params.max_new_tokens", VALID, 1, why=f"{_VERIFY}: max_new_tokens >= 0"),
    _case("new_past_context", "sampling_params.max_new_tokens", REFUSED, expr="C + 1",
          why=f"{_LENGTHS}: prompt + max_new_tokens past the context length is refused"),
    _case("new_negative", "sampling_params.max_new_tokens", REFUSED, -1, why=f"{_VERIFY}: max_new_tokens >= 0"),
    _case("min_new_zero", "sampling_params.min_new_tokens", VALID, 0,
          why=f"{_VERIFY}: min_new_tokens in [0, max_new_tokens]"),
    _case("min_new_equal", "sampling_params.min_new_tokens", UNCHECKED, expr="N",
          why=f"{_VERIFY} allows it, but 0.5.23 refuses min_new_tokens > 0 when skip_tokenizer_init is on "
              "(the harness's engine default: no tokenizer to give the EOS id), and serves it otherwise"),
    _case("min_new_past_max", "sampling_params.min_new_tokens", REFUSED, expr="N + 1",
          why=f"{_VERIFY}: min_new_tokens in [0, max_new_tokens]"),
    _case("ignore_eos_off", "sampling_params.ignore_eos", VALID, False, why="a boolean"),
    # --- stops -----------------------------------------------------------------
    _case("stop_ids_empty", "sampling_params.stop_token_ids", VALID, [], why="a list of ids"),
    _case("stop_ids_past_vocab", "sampling_params.stop_token_ids", UNCHECKED, expr="V + 7",
          why="stop ids are not checked against the vocabulary (they can never fire)"),
    _case("stop_ids_negative", "sampling_params.stop_token_ids", UNCHECKED, expr="-1",
          why="stop ids are not checked"),
    _case("stop_string", "sampling_params.stop", UNCHECKED, ["x"],
          why="a stop string needs a tokenizer; the CPU default starts with skip_tokenizer_init"),
    _case("stop_string_empty", "sampling_params.stop", UNCHECKED, [""], why="no rule names an empty stop string"),
    # --- sampling --------------------------------------------------------------
    _case("temperature_zero", "sampling_params.temperature", VALID, 0.0, why=f"{_VERIFY}: temperature >= 0"),
    _case("temperature_huge", "sampling_params.temperature", VALID, 1e6, why=f"{_VERIFY}: any finite temperature >= 0"),
    _case("temperature_negative", "sampling_params.temperature", REFUSED, -1.0, why=f"{_VERIFY}: temperature >= 0"),
    _case("top_p_tiny", "sampling_params.top_p", VALID, 1e-6, why=f"{_VERIFY}: top_p in (0, 1]"),
    _case("top_p_zero", "sampling_params.top_p", REFUSED, 0.0, why=f"{_VERIFY}: top_p in (0, 1]"),
    _case("top_p_over_one", "sampling_params.top_p", REFUSED, 1.5, why=f"{_VERIFY}: top_p in (0, 1]"),
    _case("top_k_one", "sampling_params.top_k", VALID, 1, why=f"{_VERIFY}: top_k -1 or >= 1"),
    _case("top_k_all", "sampling_params.top_k", VALID, -1, why=f"{_VERIFY}: top_k -1 (the whole vocabulary)"),
    _case("top_k_past_vocab", "sampling_params.top_k", VALID, expr="V + 100", why=f"{_VERIFY}: top_k >= 1"),
    _case("top_k_zero", "sampling_params.top_k", REFUSED, 0,
          why=f"{_VERIFY}: top_k -1 or >= 1; but SamplingParams sets top_k = 1 for temperature 0 (greedy) "
              "before verify, so with temperature_zero any top_k is served",
          moot_with=("temperature_zero",)),
    _case("min_p_one", "sampling_params.min_p", VALID, 1.0, why=f"{_VERIFY}: min_p in [0, 1]"),
    _case("min_p_over_one", "sampling_params.min_p", REFUSED, 1.5, why=f"{_VERIFY}: min_p in [0, 1]"),
    _case("frequency_penalty_max", "sampling_params.frequency_penalty", VALID, 2.0,
          why=f"{_VERIFY}: frequency_penalty in [-2, 2]"),
    _case("frequency_penalty_over", "sampling_params.frequency_penalty", REFUSED, 2.5,
          why=f"{_VERIFY}: frequency_penalty in [-2, 2]"),
    _case("presence_penalty_min", "sampling_params.presence_penalty", VALID, -2.0,
          why=f"{_VERIFY}: presence_penalty in [-2, 2]"),
    _case("repetition_penalty_max", "sampling_params.repetition_penalty", VALID, 2.0,
          why=f"{_VERIFY}: repetition_penalty in (0, 2]"),
    _case("repetition_penalty_zero", "sampling_params.repetition_penalty", REFUSED, 0.0,
          why=f"{_VERIFY}: repetition_penalty in (0, 2]"),
    _case("seed_max", "sampling_params.sampling_seed", VALID, 2**63 - 1,
          why=f"{_VERIFY}: sampling_seed in [-2**63, 2**63 - 1]"),
    _case("seed_past_int64", "sampling_params.sampling_seed", REFUSED, 2**63,
          why=f"{_VERIFY}: sampling_seed in [-2**63, 2**63 - 1]"),
    _case("logit_bias_past_vocab", "sampling_params.logit_bias", REFUSED, expr="V",
          why=f"{_VERIFY}: logit_bias keys in [0, V)"),
    # --- logprobs --------------------------------------------------------------
    _case("logprob_on", "return_logprob", VALID, True, why="a boolean"),
    _case("top_logprobs_vocab", "top_logprobs_num", VALID, expr="V", with_fields=(("return_logprob", True),),
          why="top_logprobs_num up to the vocabulary"),
    _case("top_logprobs_past_vocab", "top_logprobs_num", REFUSED, expr="V + 100",
          with_fields=(("return_logprob", True),),
          why="there are only V logprobs to return (token_ids_logprob's ids are checked against V; "
              "top_logprobs_num is not: known bug top_logprobs_num_past_vocab)",
          known_bug="top_logprobs_num_past_vocab"),
    _case("top_logprobs_negative", "top_logprobs_num", UNCHECKED, -1, with_fields=(("return_logprob", True),),
          why="no rule names a negative top_logprobs_num"),
    _case("logprob_start_zero", "logprob_start_len", VALID, 0, with_fields=(("return_logprob", True),),
          why="input logprobs from the first token"),
    _case("logprob_start_prompt", "logprob_start_len", VALID, expr="P", with_fields=(("return_logprob", True),),
          why="Scheduler.handle_generate_request: logprob_start_len up to the prompt's length"),
    _case("logprob_start_negative", "logprob_start_len", UNCHECKED, -5, with_fields=(("return_logprob", True),),
          why="-1 means 'the default'; no rule names other negative values (refused or served, either is "
              "clean: known bug logprob_start_len_negative)",
          known_bug="logprob_start_len_negative"),
    _case("logprob_start_past_prompt", "logprob_start_len", REFUSED, expr="P + 100",
          with_fields=(("return_logprob", True),),
          why="Scheduler.handle_generate_request aborts a logprob_start_len past the prompt"),
    _case("token_ids_logprob_edges", "token_ids_logprob", VALID, expr="V - 1", with_fields=(("return_logprob", True),),
          why="TokenizerManager._validate_token_ids_logprob: ids in [0, V)"),
    _case("token_ids_logprob_past_vocab", "token_ids_logprob", REFUSED, expr="V",
          with_fields=(("return_logprob", True),), why="TokenizerManager._validate_token_ids_logprob: ids in [0, V)"),
    _case("token_ids_logprob_negative", "token_ids_logprob", REFUSED, [-1], with_fields=(("return_logprob", True),),
          why="TokenizerManager._validate_token_ids_logprob: ids in [0, V)"),
    # --- other GenerateReqInput fields that reach the scheduler ------------------
    _case("hidden_states_on", "return_hidden_states", REFUSED, True,
          why=f"{_LENGTHS}: refused unless the server was started to return hidden states"),
    _case("custom_logit_processor", "custom_logit_processor", REFUSED, "x",
          why=f"{_LENGTHS}: refused unless --enable-custom-logit-processor"),
    _case("session_unknown", "session_params", UNCHECKED, {"id": "no-such-session"},
          why="Scheduler.handle_generate_request aborts a request of a session that does not exist"),
    _case("lora_unknown", "lora_path", UNCHECKED, "no-such-adapter", why="the server has no LoRA adapters"),
    _case("priority_set", "priority", UNCHECKED, 7,
          why="with priority scheduling off a priority is ignored or refused; no rule says which"),
    _case("data_parallel_rank_past", "data_parallel_rank", UNCHECKED, 3, why="one data-parallel rank"),
    _case("extra_key", "extra_key", VALID, "fuzz", why="a cache namespace: any string"),
    _case("entropy_on", "return_entropy", UNCHECKED, True, why="no rule names it on CPU"),
    _case("prompt_ids_on", "return_prompt_token_ids", UNCHECKED, True, why="no rule names it"),
    _case("text_in_logprobs", "return_text_in_logprobs", UNCHECKED, True,
          with_fields=(("return_logprob", True),), why="needs a tokenizer; the harness's servers skip it"),
    _case("sampling_unknown_key", "sampling_params.no_such_parameter", UNCHECKED, 1,
          why="SamplingParams takes named arguments only"),
    _case("regex_invalid", "sampling_params.regex", UNCHECKED, "(",
          why="a constrained-decoding grammar that does not compile"),
    _case("json_schema_invalid", "sampling_params.json_schema", UNCHECKED, "{not json",
          why="a constrained-decoding grammar that does not parse"),
    _case("thinking_budget_negative", "max_thinking_tokens", UNCHECKED, -1, why="no rule names a negative budget"),
    # --- identity ----------------------------------------------------------------
    _case("rid_reused", "rid", UNCHECKED,
          why="the rid of a request that ended and was answered (explore.fuzz_request picks it): SGLang's "
              "tokenizer has forgotten it; no rule says whether it may come back"),
)
BY_NAME: Dict[str, FieldCase] = {c.name: c for c in CASES}
assert len(BY_NAME) == len(CASES), "field-case names must be unique"

# Fields whose value is a list of the resolved expression (one id).
_LIST_FIELDS = ("sampling_params.stop_token_ids", "token_ids_logprob")


def resolve_limits(scheduler: Any) -> Dict[str, int]:
    """V (the vocabulary size), C (the context length) and L (the longest
    prompt the scheduler takes, ``max_req_input_len``, exclusive) of the
    served model."""
    cfg = getattr(scheduler, "model_config", None)
    vocab = int(getattr(cfg, "vocab_size", 0) or 0)
    context = int(getattr(cfg, "context_len", 0) or 0)
    longest = int(getattr(scheduler, "max_req_input_len", 0) or 0)
    if not vocab or not context or not longest:
        raise RuntimeError(f"request fuzzing needs the model's vocabulary size, context length and the scheduler's "
                           f"max_req_input_len; found vocab_size={vocab}, context_len={context}, "
                           f"max_req_input_len={longest}")
    return {"V": vocab, "C": context, "L": longest}


def owned_fields(case: str) -> Tuple[str, ...]:
    """The fields a case sets: its own and those it sets with it. Pure."""
    c = BY_NAME[case]
    return (c.field,) + tuple(f for f, _ in c.with_fields)


def _overrides(later: str, earlier: str) -> bool:
    """Whether ``later``, applied after ``earlier``, undoes it: it sets
    ``earlier``'s own field, or sets a field ``earlier`` sets with it to
    another value. Pure."""
    e, l = BY_NAME[earlier], BY_NAME[later]
    computed = object()  # a value resolved per request: never equal to a fixed one
    l_sets = {f: v for f, v in l.with_fields}
    l_sets[l.field] = l.value if l.expr is None and l.length is None else computed
    if e.field in l_sets:
        return True
    return any(f in l_sets and l_sets[f] != v for f, v in e.with_fields)


def effective_cases(cases: Sequence[str]) -> List[str]:
    """The cases whose values the payload still holds (``build_payload``
    applies them in order): a later case undoes an earlier one when it sets
    the earlier one's field, or a field the earlier one needs, otherwise.
    Pure."""
    out: List[str] = []
    for case in cases:
        out = [c for c in out if not _overrides(case, c)]
        out.append(case)
    return out


def expectation(cases: Sequence[str]) -> str:
    """What the survival contract requires of a request with ``cases``
    (those still in effect, ``effective_cases``): ``refused`` when any case
    is refused by SGLang's rules, else ``served`` when every case is valid,
    else ``either``. A case whose value another one makes SGLang ignore
    (``moot_with``) counts as valid. Pure."""
    effective = effective_cases(cases)
    classes = {VALID if set(BY_NAME[c].moot_with) & set(effective) else BY_NAME[c].cls for c in effective}
    if REFUSED in classes:
        return "refused"
    if classes <= {VALID}:
        return "served"
    return "either"


def build_payload(cases: Sequence[str], *, prompt: List[int], max_new_tokens: int, rid: Optional[str],
                  limits: Dict[str, int], reused_rid: Optional[str] = None) -> Dict[str, Any]:
    """The ``/generate`` payload of the base request with ``cases`` applied
    in order (a later case on the same field wins). ``rid``: None leaves it
    out (``ctx.send_generate`` gives one). ``reused_rid``: the rid
    ``rid_reused`` takes (an earlier request's); without one the case
    changes nothing. Pure."""
    unknown = [c for c in cases if c not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown field case(s) {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    sampling: Dict[str, Any] = {**BASE_SAMPLING, "max_new_tokens": max_new_tokens}
    payload: Dict[str, Any] = {"input_ids": list(prompt), "sampling_params": sampling}
    if rid is not None:
        payload["rid"] = rid
    for name in cases:
        case = BY_NAME[name]
        for field, extra in case.with_fields:
            _set(payload, field, extra)
        values = {**limits, "P": len(payload["input_ids"]), "B": len(prompt),
                  "N": int(sampling.get("max_new_tokens") or 0)}
        if case.name == "rid_reused":
            if reused_rid is not None:
                payload["rid"] = reused_rid
            continue
        if case.length is not None:
            value: Any = [_eval(case.expr or "1", values)] * max(0, _eval(case.length, values))
        elif case.expr is not None:
            value = _eval(case.expr, values)
            if case.field in _LIST_FIELDS:
                value = [value]
            elif case.field == "sampling_params.logit_bias":
                value = {str(value): 1.0}
        else:
            value = case.value
        _set(payload, case.field, value)
    return payload


def _set(payload: Dict[str, Any], field: str, value: Any) -> None:
    if field.startswith("sampling_params."):
        payload["sampling_params"][field.split(".", 1)[1]] = value
    else:
        payload[field] = value


def _body_error(body: Any) -> Optional[str]:
    """The error an answer body names: SGLang's ``{"error": {"message": ...}}``
    or an abort finish reason's message; None for a plain answer."""
    if isinstance(body, dict):
        err = body.get("error")
        if err:
            return str(err.get("message") if isinstance(err, dict) else err)
        reason = (body.get("meta_info") or {}).get("finish_reason") if isinstance(body.get("meta_info"), dict) else None
        if isinstance(reason, dict) and reason.get("type") == "abort":
            return str(reason.get("message") or "aborted")
    if isinstance(body, list) and body:
        errors = [e for e in (_body_error(b) for b in body) if e]
        return errors[0] if errors else None
    return None


def verdict(status: Optional[int], body: Any, error: Optional[str]) -> Tuple[str, str]:
    """(``served`` | ``refused`` | ``broken``, detail) of one answer: 200
    with an answer is served; 4xx with a message, or a 200 whose finish
    reason is an abort with a message, refused cleanly; anything else
    (no answer, a dropped connection, 5xx, a 4xx without a message) broken.
    Pure."""
    if error is not None or status is None:
        return "broken", f"no answer ({error or 'none'})"
    if status >= 500:
        return "broken", f"HTTP {status}: {str(body)[:200]}"
    message = _body_error(body)
    if 400 <= status < 500:
        if not message and not (isinstance(body, str) and body.strip()):
            return "broken", f"HTTP {status} without a message"
        return "refused", f"HTTP {status}: {(message or str(body))[:200]}"
    if status == 200:
        if message:
            return "refused", f"aborted: {message[:200]}"
        return "served", "HTTP 200"
    return "broken", f"HTTP {status}: {str(body)[:200]}"


# Registered by invariants.py, after the other end checks (the registry lists checks in the
# order they register, and this module is imported on its own by the explorer's harness side).
DOC = ("every fuzzed request (explore --fuzz-requests) ends with a clean answer: served when its values are "
       "valid, refused with a message when SGLang's rules refuse them, never a crash, a hang, a 5xx; the next "
       "well-formed request is then served")


def judge(cases: Sequence[str], status: Optional[int], body: Any, error: Optional[str], *,
          aborted_by_program: bool = False) -> Optional[str]:
    """The survival contract's finding for one fuzzed request's answer, or
    None when it holds. ``aborted_by_program``: the program posted an abort
    that may have hit it (``abort``, ``abort_all``, a pause in ``abort``
    mode, after it was sent): a refusal is then the program's, not SGLang's
    judgement of its values. Pure."""
    got, detail = verdict(status, body, error)
    wanted = expectation(cases)
    what = "+".join(effective_cases(cases)) or "base request"
    # The kind of broken promise first (the failure's signature is the message up to its first
    # parenthesis), the cases last.
    if got == "broken":
        return f"no clean answer to a fuzzed request: {detail} (cases {what})"
    if wanted == "served" and got != "served" and not aborted_by_program:
        return f"a fuzzed request of only valid values was refused: {detail} (cases {what})"
    if wanted == "refused" and got != "refused":
        return f"a fuzzed request holding a value SGLang's rules refuse was served: {detail} (cases {what})"
    return None


def aborted_by_program(op_names_after: Sequence[str]) -> bool:
    """Whether any of the operations posted after a request (their ledger
    names: ``abort(RID)``, ``abort_all``, ...) may have aborted it. Pure."""
    return any(name == "abort_all" or name == "pause_generation(abort)" or name.startswith("abort(")
               for name in op_names_after)


def fields_of(cases: Sequence[str]) -> List[Tuple[str, str]]:
    """(field, class) of each case, for the coverage table. Pure."""
    return [(BY_NAME[c].field, BY_NAME[c].cls) for c in cases]


def drawable_cases(breaking_bugs: Sequence[str] = ()) -> Tuple[str, ...]:
    """The cases the explorer draws: all but those that meet a registered bug
    in ``breaking_bugs`` (bugs that kill the server on the topology and
    release explored: met once they would cost a server start every time
    they are drawn, and their scenario already reproduces them). Pure."""
    return tuple(c.name for c in CASES if not c.known_bug or c.known_bug not in breaking_bugs)
