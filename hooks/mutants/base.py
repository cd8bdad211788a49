"""What every mutant module shares: the ``mutant`` decorator that declares a
mutant next to its install function, the registry it fills, the topology
groups, the SGLang modules the mutants patch, and the helpers an install
uses to find its target (a missing target, or a copied body that no longer
matches, raises ``PatchError``: "... written against 0.5.23")."""
from __future__ import annotations

import hashlib
import importlib
import inspect
import textwrap
from typing import Any, Callable, Dict, Iterable, Sequence

from scripted_runtime.hooks.patch_base import Patch, PatchError, declaring

RELEASE = "0.5.23"

# Where a mutant's effect can be seen at all (``Patch.topologies``).
PP1 = ("pp1-overlap", "pp1-normal")
ALL = ("pp1-overlap", "pp1-normal", "pp4")
HICACHE = ("pp1-hicache",)
LORA = ("pp1-lora",)
PRIORITY = ("pp1-priority",)

# The SGLang modules the mutants patch besides the scheduler module (imported
# by each install that needs them; listed for tools that snapshot them).
SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch"
MEMORY_POOL = "sglang.srt.mem_cache.memory_pool"
TOKEN_ALLOCATOR = "sglang.srt.mem_cache.allocator.token"
UNIFIED_RADIX_CACHE = "sglang.srt.mem_cache.unified_radix_cache"
MEM_CACHE_COMMON = "sglang.srt.mem_cache.common"
BATCH_RESULT_PROCESSOR = "sglang.srt.managers.scheduler_components.batch_result_processor"
WEIGHT_UPDATER = "sglang.srt.managers.scheduler_components.weight_updater"
TP_WORKER = "sglang.srt.managers.tp_worker"
FULL_COMPONENT = "sglang.srt.mem_cache.unified_cache.components.full"
PREFILL_BUDGET = "sglang.srt.mem_cache.prefill_budget"
OUTPUT_STREAMER = "sglang.srt.managers.scheduler_components.output_streamer"
SCHEDULE_POLICY = "sglang.srt.managers.schedule_policy"
WEIGHT_CHECKER = "sglang.srt.utils.weight_checker"
LORA_MEM_POOL = "sglang.srt.lora.mem_pool"
LORA_ADAPTER = "sglang.srt.lora.lora"
PATCHED_MODULES = (SCHEDULE_BATCH, MEMORY_POOL, TOKEN_ALLOCATOR, UNIFIED_RADIX_CACHE, MEM_CACHE_COMMON,
                   BATCH_RESULT_PROCESSOR, WEIGHT_UPDATER, TP_WORKER, FULL_COMPONENT, PREFILL_BUDGET,
                   OUTPUT_STREAMER, SCHEDULE_POLICY, WEIGHT_CHECKER, LORA_MEM_POOL)


# --- declaring a mutant --------------------------------------------------------

# Every mutant, in the order its module declared it (the package orders the table).
DECLARED: Dict[str, Patch] = {}


def mutant(name: str, *, topologies: Sequence[str], summary: str, expected: str,
           unreachable_on: Sequence[str] = ()) -> Callable:
    """Declare the decorated ``_install_<name>(scheduler_module)`` as mutant
    ``name``: ``summary`` is one line saying what it breaks, ``topologies``
    where its effect can be seen, ``expected`` which check should see it (in
    ``mutate.caught_by``'s words; the package docstring lists them),
    ``unreachable_on`` the ``DEVICE:TOPOLOGY`` pairs where the code it
    breaks cannot run (``mutate`` leaves those rows out). The
    docstring of the install function says the rest: the bug, why it is
    plausible, and how and when the check sees it."""
    return declaring(DECLARED, lambda install: Patch(name, summary, install, tuple(topologies), expected,
                                                              tuple(unreachable_on)))


def in_order(names: Iterable[str]) -> Dict[str, Patch]:
    """The declared mutants as a table in the order ``names`` gives; every
    declared mutant must be named exactly once."""
    names = list(names)
    if sorted(names) != sorted(DECLARED) or len(set(names)) != len(names):
        raise PatchError(f"the mutant order names {sorted(names)}, the modules declare {sorted(DECLARED)}")
    return {name: DECLARED[name] for name in names}


# --- helpers -----------------------------------------------------------------


def missing_target(mutant: str, what: str) -> PatchError:
    return PatchError(f"mutant {mutant}: {what} not found: this mutant is written against SGLang {RELEASE}")


def find_attr(owner: Any, name: str, mutant: str, what: str) -> Any:
    value = getattr(owner, name, None) if owner is not None else None
    if value is None:
        raise missing_target(mutant, what)
    return value


def find_module(name: str, mutant: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise missing_target(mutant, f"module {name} ({exc})") from exc


def scheduler_class(scheduler_module: Any, mutant: str) -> type:
    return find_attr(scheduler_module, "Scheduler", mutant, "sglang.srt.managers.scheduler.Scheduler")


def find_method(cls: type, name: str, mutant: str, params: tuple = ()) -> Callable:
    """``cls.name``, checked to take ``params`` (by name, after self)."""
    fn = find_attr(cls, name, mutant, f"{cls.__name__}.{name}")
    if params:
        try:
            have = list(inspect.signature(inspect.unwrap(fn)).parameters)
        except (TypeError, ValueError):
            have = []
        if any(p not in have for p in params):
            raise missing_target(mutant, f"{cls.__name__}.{name}({', '.join(params)}) (found ({', '.join(have)}))")
    return fn


def replace_attr(owner: Any, name: str, new: Callable, original: Callable) -> None:
    new.__wrapped__ = original
    setattr(owner, name, new)


def weight_updater_manager(scheduler_module: Any, mutant: str) -> type:
    """0.5.23's ``SchedulerWeightUpdaterManager`` (the weight and memory handlers)."""
    scheduler_class(scheduler_module, mutant)
    return find_attr(find_module(WEIGHT_UPDATER, mutant), "SchedulerWeightUpdaterManager", mutant,
                     f"{WEIGHT_UPDATER}.SchedulerWeightUpdaterManager")


def without_flush(cls: type, method: str, mutant: str, when: Callable[[Any], bool] = lambda self: True) -> None:
    """Replace handler ``cls.method(self, recv_req)`` by one that runs it with
    ``self.flush_cache`` reporting success and doing nothing (when ``when(self)``):
    the mutants whose handler keeps a cache it says it flushed."""
    original = find_method(cls, method, mutant, ("recv_req",))

    def flush_nothing(*args: Any, **kwargs: Any) -> bool:
        return True

    def handler(self, recv_req):
        if not when(self):
            return original(self, recv_req)
        flush = self.flush_cache
        self.flush_cache = flush_nothing  # MUTANT: the cache is kept
        try:
            return original(self, recv_req)
        finally:
            self.flush_cache = flush

    handler.__name__ = handler.__qualname__ = method
    replace_attr(cls, method, handler, original)


def source_digest(fn: Callable) -> str:
    """Digest of a function's normalized source (its innermost ``__wrapped__``)."""
    src = textwrap.dedent(inspect.getsource(fn))
    norm = "\n".join(line.rstrip() for line in src.splitlines() if line.strip())
    return hashlib.sha256(norm.encode()).hexdigest()[:16]


def check_copied_body(fn: Callable, digest: str, mutant: str, what: str) -> None:
    try:
        found = source_digest(fn)
    except (OSError, TypeError) as exc:
        raise missing_target(mutant, f"the source of {what} ({exc})") from exc
    if found != digest:
        raise PatchError(f"mutant {mutant}: {what} differs from the {RELEASE} body this mutant copies "
                         f"(source digest {found}, expected {digest}): it is written against SGLang {RELEASE}")
