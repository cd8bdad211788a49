"""The script-facing API (runs inside the scheduler process on the driver
rank): ``api.ScriptContext`` (the ``ctx`` a script receives),
``requests.ReqHandle``, ``waits`` (``wait_until``, ``WaitTimeout``) and the
radix-tree reads in ``radix``.

Nothing is imported here: ``radix`` and ``waits`` are read by the invariants,
the trace record and the control ledger, which the context itself builds
on, so importing them must not pull in the context.
"""
