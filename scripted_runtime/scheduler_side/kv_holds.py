"""The KV slots a script took from the allocator (``ctx.exhaust_kv``),
held until the next engine reset gives them back.

SGLang's own idle pool-leak check (0.5.2x) is told how many tokens are held
(``sglang_compat.set_script_held_tokens``), and the step observer counts
them as held when it checks the pools.
"""
from __future__ import annotations

from typing import Any, List

from scripted_runtime.hooks import sglang_compat


class KvHolds:
    def __init__(self, scheduler: Any) -> None:
        self._scheduler = scheduler
        self._held: List[Any] = []  # the index tensors the allocator handed out

    @property
    def holding(self) -> bool:
        """Whether anything is held (the reset must then drain)."""
        return bool(self._held)

    @property
    def tokens(self) -> int:
        return sum(int(held.numel()) for held in self._held)

    def take(self, need: int) -> bool:
        """Take ``need`` tokens from the allocator; False when it refused."""
        held = self._scheduler.token_to_kv_pool_allocator.alloc(need)
        if held is None:
            return False
        self._held.append(held)
        sglang_compat.set_script_held_tokens(self._scheduler, self.tokens)
        return True

    def release(self) -> None:
        """Give everything back to the allocator."""
        for held in self._held:
            self._scheduler.token_to_kv_pool_allocator.free(held)
        self._held.clear()
        sglang_compat.set_script_held_tokens(self._scheduler, 0)
