"""KV caches that outlive their requests: a finished sequence's cache is kept with the token ids it
holds, and a new prompt that begins the same way (the same system prompt, the next turn of a chat)
takes it over and runs only its new tokens, as llama-server's slots do. A prompt that shares a prefix
with a sequence still running gets a copy of that prefix's keys and values."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from torchburn_llm.model import KVCache


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def cache_bytes(cache: KVCache) -> int:
    return cache.keys.nbytes + cache.values.nbytes


class PrefixCache:
    """Idle caches by the ids they hold, least recently used dropped first past ``budget`` bytes."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._entries: OrderedDict[int, tuple[list[int], KVCache]] = OrderedDict()
        self._next = 0

    @property
    def nbytes(self) -> int:
        return sum(cache_bytes(c) for _, c in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, ids: list[int], cache: KVCache) -> None:
        if cache_bytes(cache) > self.budget:
            return
        self._entries[self._next] = (ids, cache)
        self._next += 1
        while self.nbytes > self.budget:
            self._entries.popitem(last=False)

    def longest(self, prompt: Sequence[int], capacity: int) -> int:
        """How long a prefix of ``prompt`` :meth:`take` would give (0: none), taking nothing."""
        return self._best(prompt, capacity, 0)[1]

    def take(self, prompt: Sequence[int], capacity: int, longer_than: int = 0) -> tuple[KVCache, int] | None:
        """The idle cache of at least ``capacity`` positions holding the longest prefix of ``prompt``,
        truncated to that prefix, and its length; None where none shares more than ``longer_than``
        tokens."""
        best, best_len = self._best(prompt, capacity, longer_than)
        if best is None:
            return None
        _, cache = self._entries.pop(best)
        cache.reset(best_len)
        return cache, best_len

    def _best(self, prompt: Sequence[int], capacity: int, longer_than: int) -> tuple[int | None, int]:
        """The key of the entry of at least ``capacity`` positions sharing the longest prefix with
        ``prompt`` (None where none shares more than ``longer_than`` tokens), and that length."""
        best, best_len = None, longer_than
        for key, (ids, cache) in self._entries.items():
            n = common_prefix(ids, prompt)
            if n > best_len and cache.capacity >= capacity:
                best, best_len = key, n
        return best, best_len

    def clear(self) -> None:
        self._entries.clear()
