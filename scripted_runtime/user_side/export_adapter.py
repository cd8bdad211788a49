"""The scripted-runtime context API over SGLang's own ``ScriptedContext``
(``sglang.test.scripted_runtime``, 0.5.13+).

``scripted-runtime export`` copies this module's source, between the markers
below, into every exported test: an exported test imports only SGLang, so
it can go into an SGLang pull request as it is. It covers the part of the
context API a portable scenario uses (``export.SUPPORTED``); ``export``
refuses a scenario that uses more, naming what.
"""
# --- begin adapter ---
class _Handle:
    """A request handle as scripted-runtime scenarios see it."""

    def __init__(self, handle):
        self._h = handle

    rid = property(lambda self: self._h.rid)
    req = property(lambda self: self._h.req)
    finished = property(lambda self: self._h.finished)
    is_chunking = property(lambda self: self._h.is_chunking)
    chunks_done = property(lambda self: self._h.chunks_done)
    status = property(lambda self: self._h.status)
    sglang_handle = property(lambda self: self._h)  # the handle SGLang's context returned

    @property
    def req_pool_idx(self):
        req = self._h.req
        if req is None:
            return None
        kv = getattr(req, "kv", None)  # 0.5.2x keeps it under req.kv; older releases on the request
        return kv.req_pool_idx if kv is not None and hasattr(kv, "req_pool_idx") else getattr(req, "req_pool_idx", None)

    @property
    def output_ids(self):
        req = self._h.req
        return [] if req is None else list(req.output_ids)


def _chunked_between_chunks(s):
    req = getattr(s, "chunked_req", None)
    return req is not None and not req.finished()


def _finished_not_pruned(s):
    for name in ("running_batch", "last_batch"):
        batch = getattr(s, name, None)
        if batch is not None and any(r.finished() for r in (getattr(batch, "reqs", None) or ())):
            return True
    return False


_WINDOWS = {"chunked_between_chunks": _chunked_between_chunks, "finished_not_pruned": _finished_not_pruned}


class _Context:
    """The scripted-runtime context API a portable scenario uses."""

    def __init__(self, ctx):
        self._ctx = ctx
        self.step = 0

    @property
    def scheduler(self):
        return self._ctx.scheduler

    def start_req(self, **kwargs):
        return _Handle(self._ctx.start_req(**kwargs))

    def pause_generation(self, mode="retract"):
        return self._ctx.pause_generation(mode=mode)

    def continue_generation(self):
        return self._ctx.continue_generation()

    def abort_all(self):
        return self._ctx.abort_all()

    def abort(self, handle):
        return self._ctx.abort(handle.sglang_handle)

    def flush_cache(self):
        return self._ctx.flush_cache()

    def describe(self):
        return f"step={self.step} engine={self._ctx.engine_stats()} fully_idle={self._ctx.is_fully_idle()}"

    def steps(self, n):
        for _ in range(n):
            yield

    def wait_until(self, predicate, max_steps=200, what="condition"):
        for _ in range(max_steps):
            if predicate():
                return
            yield
        if not predicate():
            raise AssertionError(f"{what} not reached within {max_steps} steps; {self.describe()}")

    def wait_finished(self, *handles, max_steps=200):
        yield from self.wait_until(lambda: all(h.finished for h in handles), max_steps,
                                   f"requests {[h.rid for h in handles]} finished")

    def wait_for_window(self, name, max_steps=200, required=True):
        predicate = _WINDOWS[name]
        for _ in range(max_steps):
            if predicate(self._ctx.scheduler):
                return True
            yield
        if required:
            raise AssertionError(f"window {name!r} not reached within {max_steps} steps; {self.describe()}")
        return False


def _adapted(scenario, ctx, *args):
    """Run a scripted-runtime scenario generator on SGLang's ScriptedContext:
    one ``yield`` = one scheduler iteration in both harnesses."""
    context = _Context(ctx)
    gen = scenario(context, *args)
    while True:
        try:
            next(gen)
        except StopIteration:
            return
        yield
        context.step += 1
# --- end adapter ---


def source() -> str:
    """The adapter's source, as it goes into an exported test."""
    import inspect
    import sys

    text = inspect.getsource(sys.modules[__name__])
    begin, end = "# --- begin adapter ---\n", "# --- end adapter ---\n"
    return text[text.index(begin) + len(begin):text.index(end)]
