"""Demo scenario: a chunked prefill you can watch, then decode to completion.

Run it:  scripted-runtime run scenarios/demo.py:chunked_then_decode
"""


def chunked_then_decode(ctx, prompt_len=150, max_new_tokens=8):
    # 150 tokens with 64-token chunks: three prefill chunks, then decode.
    req = ctx.start_req(prompt_len=prompt_len, max_new_tokens=max_new_tokens, ignore_eos=True)
    yield from ctx.wait_until(lambda: req.is_chunking, max_steps=10, what="first chunk")
    row = req.req_pool_idx
    yield from ctx.wait_until(lambda: not req.is_chunking, max_steps=20, what="last chunk")
    assert req.chunks_done >= 2, f"expected several chunks, saw {req.chunks_done}"
    yield from ctx.wait_finished(req, max_steps=200)
    assert len(req.output_ids) == max_new_tokens, req.output_ids
    print(f"demo: row {row}, {req.chunks_done} chunks, output {req.output_ids}")
    return {"chunks": req.chunks_done, "output_len": len(req.output_ids)}
