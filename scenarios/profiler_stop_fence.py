"""A candidate SGLang fix for the PP profiler crash (registry entry
``pp_profiler_stop_with_sends_in_flight``, docs/upstream/pp-profiler-stop-with-sends-in-flight.md),
as a patch for ``--patch`` (docs/mutants.md, "Writing your own mutant"):

    scripted-runtime run scenarios/profiler_stress.py:with_profiles --pp 4 \\
        --patch scenarios/profiler_stop_fence.py:fence_sends_before_profiler_stop

Before the torch profiler stops, the PP loop's asynchronous point-to-point
sends still in flight (``send_req_work``, ``send_proxy_work``,
``send_output_work``) are waited for, so no gloo ``AsyncWork`` completes
while the profiler is torn down. ``_pp_commit_comm_work`` empties the
list it waited on, so the loop's own commit later finds nothing to wait
for (a second ``wait()`` on a completed gloo work does not return)."""


def fence_sends_before_profiler_stop(scheduler_module):
    """candidate fix: wait the PP loop's in-flight sends before the torch profiler stops"""
    scheduler_cls = scheduler_module.Scheduler
    original_init_profiler = scheduler_cls.init_profiler

    def init_profiler(self):
        original_init_profiler(self)
        manager = self.profiler_manager
        original_stop = manager._stop_profile

        def _stop_profile(*args, **kwargs):
            if getattr(self, "pp_group", None) is not None and self.pp_group.world_size > 1:
                self._pp_commit_comm_work(self.send_req_work)
                self._pp_commit_proxy_send_work()  # as the loop does: it keeps the CUDA-graph forward fence
                self._pp_commit_comm_work(self.send_output_work)
            return original_stop(*args, **kwargs)

        manager._stop_profile = _stop_profile

    scheduler_cls.init_profiler = init_profiler
