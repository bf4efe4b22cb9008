"""The KV memory's bookkeeping: fixed-size blocks handed out and taken back, with vLLM's automatic prefix cache.
Ids only: the tensors live in the engine (engine.paged). The scheduler is its one user."""

from __future__ import annotations

import itertools
from collections import OrderedDict


class BlockPool:
    """Fixed-size KV blocks, handed out and taken back (ids only: the tensors live in the engine), with a
    prefix cache (vLLM's automatic prefix caching): a full block of prompt tokens whose K/V are written can be
    registered under its tokens and everything before them; a later prompt that starts with the same tokens
    shares that block instead of computing it again. A block is shared by reference count; when nobody holds a
    registered block it stays cached (evictable, least recently freed first) until the pool needs it.

    Keys are exact, not hashes: (the key's serial of the block before, this block's tokens), so a block is
    matched only when every token before it matched too, and no collision can hand one prompt another's K/V."""

    def __init__(self, n_blocks: int, block_size: int):
        if n_blocks < 1 or block_size < 1:
            raise ValueError("the KV pool needs at least one block of at least one token")
        self.n_blocks, self.block_size = n_blocks, block_size
        self._free = list(range(n_blocks - 1, -1, -1))  # blocks holding nothing anyone can reuse
        self._refs: dict[int, int] = {}  # block -> requests holding it (blocks handed out)
        self._cached: dict[tuple, tuple[int, int]] = {}  # (parent serial, tokens) -> (block, serial)
        self._key_of: dict[int, tuple] = {}  # registered block -> its key
        self._evictable: OrderedDict[int, None] = OrderedDict()  # registered blocks nobody holds, oldest first
        self._serials = itertools.count(1)  # 0: the root (no block before)
        self.hit_tokens = 0  # prompt tokens served from the cache since the pool was made
        self.hit_requests = 0

    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    @property
    def n_free(self) -> int:
        """Blocks a request can take now: empty ones and cached ones nobody holds."""
        return len(self._free) + len(self._evictable)

    @property
    def n_cached(self) -> int:
        return len(self._key_of)

    def take(self, n: int) -> list[int]:
        if n > self.n_free:
            raise RuntimeError(f"{n} blocks asked, {self.n_free} free")
        out = []
        for _ in range(n):
            if self._free:
                b = self._free.pop()
            else:  # the least recently freed cached block: forgotten, reused
                b, _ = self._evictable.popitem(last=False)
                del self._cached[self._key_of.pop(b)]
            self._refs[b] = 1
            out.append(b)
        return out

    def give_back(self, blocks: list[int]) -> None:
        for b in reversed(blocks):
            n = self._refs.pop(b, 1) - 1
            if n > 0:
                self._refs[b] = n
            elif b in self._key_of:
                self._evictable[b] = None  # still cached: a later prompt may start with these tokens
            else:
                self._free.append(b)

    def forget_cached(self) -> int:
        """Drop every cached block nobody holds (the benchmark's fresh start); returns how many."""
        n = len(self._evictable)
        for b in self._evictable:
            del self._cached[self._key_of.pop(b)]
            self._free.append(b)
        self._evictable.clear()
        return n

    def match(self, tokens: list[int]) -> tuple[list[int], int]:
        """The cached blocks that hold the longest run of `tokens`' full blocks from the start, leaving at least the
        last token to compute (its logits give the first new token), and the serial of the last of them (0: none)."""
        bs, out, serial = self.block_size, [], 0
        for i in range((len(tokens) - 1) // bs):
            hit = self._cached.get((serial, tuple(tokens[i * bs : (i + 1) * bs])))
            if hit is None:
                break
            out.append(hit[0])
            serial = hit[1]
        return out, serial

    def fits(self, n: int, shared: list[int]) -> bool:
        """Can n new blocks be taken once `shared` (matched, maybe evictable) are held?"""
        return n + sum(b in self._evictable for b in shared) <= self.n_free

    def share(self, blocks: list[int]) -> None:
        """Hold matched blocks (one more reference each; a cached block nobody held is no longer evictable)."""
        for b in blocks:
            self._evictable.pop(b, None)
            self._refs[b] = self._refs.get(b, 0) + 1

    def register(self, block: int, parent_serial: int, tokens: list[int]) -> int:
        """Cache a block whose K/V for `tokens` are written in every layer; returns the key's serial (the next
        block's parent). When the same tokens are cached already (two prompts computed them at once), the block
        stays unregistered and the cached entry's serial is returned."""
        key = (parent_serial, tuple(tokens))
        hit = self._cached.get(key)
        if hit is not None:
            return hit[1]
        serial = next(self._serials)
        self._cached[key] = (block, serial)
        self._key_of[block] = key
        return serial
