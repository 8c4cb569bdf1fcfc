from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kiln.engine.block_pool import ROOT_HASH, BlockPool, block_hashes, hash_block


def test_allocate_free_refcounts() -> None:
    pool = BlockPool(4, 2)
    a = pool.allocate(3)
    assert len(set(a)) == 3 and pool.num_free_blocks == 1 and pool.num_used_blocks == 3
    assert all(pool.ref_count(b) == 1 for b in a)
    with pytest.raises(RuntimeError):
        pool.allocate(2)
    pool.free(a)
    assert pool.num_free_blocks == 4
    with pytest.raises(RuntimeError):
        pool.free([a[0]])


def test_hash_chain_depends_on_parent() -> None:
    h = block_hashes([1, 2, 3, 4, 5], 2)
    assert len(h) == 2
    assert h[0] == hash_block(ROOT_HASH, [1, 2]) and h[1] == hash_block(h[0], [3, 4])
    assert block_hashes([9, 9, 3, 4], 2)[1] != h[1]


def _cache(pool: BlockPool, tokens: list[int]) -> list[int]:
    hs = block_hashes(tokens, pool.block_size)
    ids = pool.allocate(len(hs))
    for i, (b, h) in enumerate(zip(ids, hs, strict=True)):
        parent = hs[i - 1] if i else ROOT_HASH
        pool.cache_block(b, h, parent, tokens[i * pool.block_size:(i + 1) * pool.block_size])
    return ids


def test_prefix_hit_survives_free_until_evicted() -> None:
    pool = BlockPool(4, 2)
    toks = [1, 2, 3, 4]
    ids = _cache(pool, toks)
    hs = block_hashes(toks, 2)
    assert pool.lookup(hs, toks) == ids
    pool.free(ids)
    assert pool.lookup(hs, toks) == ids  # still cached while free
    assert pool.num_unreferenced(ids) == 2
    pool.touch(ids)
    assert pool.num_free_blocks == 2 and pool.ref_count(ids[0]) == 1
    pool.touch(ids)
    assert pool.ref_count(ids[0]) == 2
    pool.free(ids)
    pool.free(ids)
    # Allocating all blocks evicts the cached ones; the prefix is gone.
    pool.allocate(4)
    assert pool.lookup(hs, toks) == []
    assert pool.num_evictions == 2


def test_uncached_blocks_reused_before_cached_ones() -> None:
    pool = BlockPool(3, 2)
    toks = [1, 2]
    cached = _cache(pool, toks)
    plain = pool.allocate(1)
    pool.free(cached)
    pool.free(plain)
    assert pool.allocate(1) == plain
    assert pool.lookup(block_hashes(toks, 2), toks) == cached


def test_lookup_stops_at_first_miss_and_checks_tokens() -> None:
    pool = BlockPool(4, 2)
    _cache(pool, [1, 2, 3, 4])
    other = [1, 2, 7, 7]
    assert len(pool.lookup(block_hashes(other, 2), other)) == 1
    disabled = BlockPool(4, 2, enable_prefix_caching=False)
    _cache(disabled, [1, 2])
    assert disabled.lookup(block_hashes([1, 2], 2), [1, 2]) == []


class PoolMachine(RuleBasedStateMachine):
    """Random alloc / cache / free / touch sequences keep the pool's books balanced."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(8, 2)
        self.owned: list[list[int]] = []  # each entry: one reference on each block
        self.n = 0

    @rule(k=st.integers(1, 3), data=st.data())
    def alloc(self, k: int, data: st.DataObject) -> None:
        if k > self.pool.num_free_blocks:
            return
        ids = self.pool.allocate(k)
        if data.draw(st.booleans()):
            self.n += 1
            toks = [self.n % 3, self.n % 5] * k
            hs = block_hashes(toks, 2)
            for i, b in enumerate(ids):
                self.pool.cache_block(b, hs[i], hs[i - 1] if i else ROOT_HASH,
                                      toks[2 * i:2 * i + 2])
            hit = self.pool.lookup(hs, toks)
            assert len(hit) <= k
        self.owned.append(ids)

    @precondition(lambda self: bool(self.owned))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.owned) - 1))
        self.pool.free(self.owned.pop(i))

    @precondition(lambda self: bool(self.owned))
    @rule(data=st.data())
    def share(self, data: st.DataObject) -> None:
        ids = self.owned[data.draw(st.integers(0, len(self.owned) - 1))]
        self.pool.touch(ids)
        self.owned.append(list(ids))

    @invariant()
    def books_balance(self) -> None:
        refs: dict[int, int] = {}
        for ids in self.owned:
            for b in ids:
                refs[b] = refs.get(b, 0) + 1
        for b in range(self.pool.num_blocks):
            assert self.pool.ref_count(b) == refs.get(b, 0)
        assert self.pool.num_used_blocks == len(refs)


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_salted_roots_differ_by_salt_and_keep_the_unsalted_root() -> None:
    from kiln.engine.block_pool import ROOT_HASH, salted_root

    assert salted_root(ROOT_HASH, None) == ROOT_HASH and salted_root(7, None) == 7
    roots = {salted_root(r, s) for r in (ROOT_HASH, 7) for s in ("a", "b", "")}
    assert len(roots) == 6 and ROOT_HASH not in roots
    assert salted_root(7, "a") == salted_root(7, "a")  # stable: the same salt shares
