"""Paged-KV block allocator with prefix caching (pure Python, never imports torch).

Blocks hold ``block_size`` tokens. A block with ref count 0 sits in the free queue (LRU order:
the least recently freed block is reallocated first). A full block carries a hash of
``(parent_hash, tuple(token_ids))``; while it is free it stays findable by that hash, so a later
request with the same prefix reuses it, until the allocator hands it out again (eviction).
Full blocks are immutable, so sharing them needs no copy-on-write.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

ROOT_HASH = 0  # parent hash of a sequence's first block


def salted_root(root: int, cache_salt: str | None) -> int:
    """The parent hash of a request's first block under its ``cache_salt`` (vLLM's): requests
    with different salts never share a prefix-cache block (the salt is in every block's chain);
    no salt leaves ``root`` as it is."""
    if cache_salt is None:
        return root
    digest = hashlib.sha256(b"kiln-cache-salt-v1\0" + cache_salt.encode("utf-8")).digest()
    value = (int.from_bytes(digest[:8], "little") >> 1) ^ root
    return value if value != ROOT_HASH else 1


def hash_block(parent_hash: int, token_ids: Sequence[int]) -> int:
    return hash((parent_hash, tuple(token_ids)))


def block_hashes(token_ids: Sequence[int], block_size: int, start: int = 0,
                 parent: int = ROOT_HASH) -> list[int]:
    """The hash chain of the full blocks of ``token_ids`` from block index ``start`` on."""
    out: list[int] = []
    for i in range(start, len(token_ids) // block_size):
        parent = hash_block(parent, token_ids[i * block_size:(i + 1) * block_size])
        out.append(parent)
    return out


@dataclass
class _Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    key: tuple[int, tuple[int, ...]] | None = None  # (parent_hash, tokens), to rule out collisions


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("BlockPool: num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._blocks = [_Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[int, int] = {}  # hash -> block id
        self.num_evictions = 0

    # -- queries -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be allocated now (free, including cached-but-unreferenced ones)."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def ref_count(self, block_id: int) -> int:
        return self._blocks[block_id].ref_count

    def lookup(self, hashes: Sequence[int], token_ids: Sequence[int]) -> list[int]:
        """Block ids of the longest cached prefix of the chain ``hashes`` (no refs taken)."""
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        out: list[int] = []
        parent = ROOT_HASH
        for i, h in enumerate(hashes):
            bid = self._cached.get(h)
            if bid is None:
                break
            key = (parent, tuple(token_ids[i * bs:(i + 1) * bs]))
            if self._blocks[bid].key != key:
                break
            out.append(bid)
            parent = h
        return out

    def num_unreferenced(self, block_ids: Sequence[int]) -> int:
        """How many of these blocks sit in the free queue (touching them uses up free blocks)."""
        return sum(1 for b in block_ids if self._blocks[b].ref_count == 0)

    # -- mutations -----------------------------------------------------------------------
    def touch(self, block_ids: Sequence[int]) -> None:
        """Take a reference on (cached) blocks, pulling unreferenced ones off the free queue."""
        for bid in block_ids:
            blk = self._blocks[bid]
            if blk.ref_count == 0:
                del self._free[bid]
            blk.ref_count += 1

    def allocate(self, n: int) -> list[int]:
        """``n`` fresh blocks (ref count 1), evicting the least recently freed cached blocks."""
        if n > len(self._free):
            raise RuntimeError(f"BlockPool: {n} blocks requested, {len(self._free)} free")
        out: list[int] = []
        for _ in range(n):
            bid, _ = self._free.popitem(last=False)
            blk = self._blocks[bid]
            if blk.hash is not None:
                if self._cached.get(blk.hash) == bid:
                    del self._cached[blk.hash]
                self.num_evictions += 1
                blk.hash = None
                blk.key = None
            blk.ref_count = 1
            out.append(bid)
        return out

    def free(self, block_ids: Sequence[int]) -> None:
        """Drop one reference per block. Tail blocks first, so they are evicted before heads."""
        for bid in reversed(block_ids):
            blk = self._blocks[bid]
            if blk.ref_count <= 0:
                raise RuntimeError(f"BlockPool: double free of block {bid}")
            blk.ref_count -= 1
            if blk.ref_count == 0:
                if blk.hash is None:
                    # An uncached block is worthless: put it first in line for reuse.
                    self._free[bid] = None
                    self._free.move_to_end(bid, last=False)
                else:
                    self._free[bid] = None

    def cache_block(self, block_id: int, block_hash: int, parent_hash: int,
                    token_ids: Sequence[int]) -> None:
        """Register a full, computed block under its hash (first writer wins on duplicates)."""
        if not self.enable_prefix_caching:
            return
        blk = self._blocks[block_id]
        if blk.hash is not None or block_hash in self._cached:
            return
        if len(token_ids) != self.block_size:
            raise ValueError("cache_block: only full blocks can be cached")
        blk.hash = block_hash
        blk.key = (parent_hash, tuple(token_ids))
        self._cached[block_hash] = block_id

    def reset_prefix_cache(self) -> int:
        """Forget every cached hash, of free blocks and of blocks in use alike (a block in use
        stays its request's, but is never found by another and goes first when freed): after a
        reset no prompt reuses a block computed before it. Returns how many were forgotten."""
        forgotten = len(self._cached)
        for bid in list(self._cached.values()):
            blk = self._blocks[bid]
            blk.hash = None
            blk.key = None
        self._cached.clear()
        return forgotten
