"""A request resumed after a retraction must go on from its prompt and its
own output: the ``fill_ids`` contract (docs/checks.md, "The fill ids") at
its re-prefill, and the output oracle at its end.

Run it (at pp=4 with the ``pause`` check off: the registered
``pp_pause_ignored`` keeps the other micro-batches running, and the retract
takes the current one's requests only):
  scripted-runtime run --no-overlap scenarios/retract_resume.py:resumed_after_a_retract_pause
  scripted-runtime run --pp 4 --skip-invariant pause scenarios/retract_resume.py:resumed_after_a_retract_pause
"""


def resumed_after_a_retract_pause(ctx, prompt_len=16, max_new_tokens=12, after=3):
    """Must pass: one greedy request decodes ``after`` tokens, a
    ``pause_generation(retract)`` puts it back in the queue (its KV given
    back), a continue re-admits it, and it re-prefills its prompt and the
    tokens it had, then finishes with exactly its reference's tokens. With
    ``mut_fill_ids_refresh_discards_append`` its fill ids keep the prompt
    alone: ``ContractViolation[fill_ids]`` at the re-prefill (and, unchecked,
    an output that starts over after its first tokens)."""
    from scripted_runtime.scheduler_side.explore import program as explore

    req = ctx.start_req(input_ids=explore.prompt_ids(0, prompt_len), max_new_tokens=max_new_tokens,
                        ignore_eos=True, temperature=0.0)
    for _ in range(400):
        if len(req.output_ids) >= after:
            break
        yield
    yield from ctx.pause_generation("retract").wait(max_steps=60)
    retractions = int(getattr(req.last_req, "retraction_count", 0) or 0)
    yield from ctx.steps(2 * ctx.pp_loop_size)
    ctx.continue_generation()
    checks = yield from explore.end_state_checks(ctx, [req])
    return {"retractions": retractions, **checks}
