"""PR 17850: a chunked request's req_to_token row reused between its chunks (pp=1).

Window: ``chunked_between_chunks``. A 200-token prompt is prefilled in four
64-token chunks; between two chunks a second, short request arrives and is
given a row.

* Buggy build (<=0.5.8.post1, or 0.5.23 with ``--revert-fix pr17850``): the
  scheduler frees the chunked request's row after every chunk and the next
  chunk takes a fresh one, so the request moves rows between chunks, and the
  row it left (which the previous chunk's forward may still read on a GPU) is
  handed to the short request. With invariants on (the default) the script
  fails at the move with ``InvariantViolation[slot_ownership]`` ("chunked
  request ... moved from row A to row B between chunks"); with
  ``--no-invariants`` the script's own check fails with the rows it saw.
* Fixed build (0.5.9+): the row is the same from the first chunk to the
  last, the short request gets another row, both finish; the scenario passes.

On CPU the forward is synchronous, so a reused row is never read and written
at once: the scenario checks the logical event (the row changing hands while
the request is still chunking), which is what makes the GPU read-after-free
possible.

Run: ``scripted-runtime run scenarios/chunked_row_reuse.py:chunked_row_reuse
[--no-overlap] [--revert-fix pr17850] [--no-invariants]``
"""
from __future__ import annotations


def chunked_row_reuse(ctx, prompt_len: int = 200):
    long = ctx.start_req(prompt_len=prompt_len, max_new_tokens=4, ignore_eos=True)
    yield from ctx.wait_for_window("chunked_between_chunks", max_steps=40)
    first_row = long.req_pool_idx
    rows = [first_row]
    short = ctx.start_req(prompt_len=8, max_new_tokens=4, ignore_eos=True, prompt_token=7)
    handed_over = None  # (step, row) where the short request got a row the long one had used
    for _ in range(200):
        if long.finished and short.finished:
            break
        yield
        if long.is_chunking:
            row = long.req_pool_idx
            if row is not None and row != rows[-1]:
                rows.append(row)
        short_row = short.req_pool_idx
        if handed_over is None and short_row is not None and long.is_chunking and short_row in rows:
            handed_over = (ctx.step, short_row)
    else:
        raise AssertionError(f"requests did not finish within 200 steps: {ctx.describe()}")
    assert len(rows) == 1, (
        f"chunked request {long.rid} moved rows between chunks: {rows} (PR 17850); "
        + (f"its row {handed_over[1]} went to {short.rid} at step {handed_over[0]} while it was "
           "still chunking" if handed_over else "its old row went back to the free list"))
    assert handed_over is None, f"row {handed_over[1]} handed to {short.rid} at step {handed_over[0]}"
    return {"row": first_row, "short_row": short.req_pool_idx, "chunks": long.chunks_done,
            "output_lens": (len(long.output_ids), len(short.output_ids))}
