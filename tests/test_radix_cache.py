"""Unit tests of RadixCache: split, insert, match, lock, evict, namespaces, disabled, lifecycle."""

import pytest
import torch

from radixgen.radix_cache import RadixCache, ReqToTokenPool, SlotAllocator

NUM_SLOTS = 64


@pytest.fixture
def allocator():
    return SlotAllocator(NUM_SLOTS)


@pytest.fixture
def cache(allocator):
    return RadixCache(allocator)


def insert_new(cache: RadixCache, key, namespace=None) -> torch.Tensor:
    """Allocate slots for `key`, insert them, free the duplicates; returns the slots used."""
    slots = cache.slot_allocator.alloc(len(key))
    num_cached = cache.insert(key, slots, namespace=namespace)
    cache.slot_allocator.free(slots[:num_cached])
    return slots


def assert_slots_conserved(cache: RadixCache, *live: torch.Tensor) -> None:
    """Every slot but 0 is exactly one of: free, in the tree, held by a live request."""
    held = [cache.slot_allocator.free_slot_indices(), cache.tree_slots(), *live]
    everything = torch.cat(held).sort().values
    assert torch.equal(everything, torch.arange(1, NUM_SLOTS)), "slot lost or owned twice"
    cache.check_invariants()


def test_insert_returns_number_of_tokens_already_cached(cache):
    first = insert_new(cache, [1, 2, 3, 4])
    assert cache.total_size() == 4
    second = cache.slot_allocator.alloc(6)
    assert cache.insert([1, 2, 3, 4, 5, 6], second) == 4
    cache.slot_allocator.free(second[:4])
    assert cache.total_size() == 6
    match = cache.match_prefix([1, 2, 3, 4, 5, 6, 7])
    assert torch.equal(match.slots, torch.cat([first, second[4:]]))
    assert_slots_conserved(cache)


def test_match_ending_inside_an_edge_splits_it(cache):
    slots = insert_new(cache, [1, 2, 3, 4, 5])
    match = cache.match_prefix([1, 2, 3, 9])
    assert match.prefix_len == 3
    assert torch.equal(match.slots, slots[:3])
    assert match.last_node.key == (1, 2, 3)
    assert list(match.last_node.children) == [4]
    assert match.last_node.children[4].key == (4, 5)
    # The split keeps the remaining suffix reachable.
    assert torch.equal(cache.match_prefix([1, 2, 3, 4, 5]).slots, slots)
    assert_slots_conserved(cache)


def test_any_prefix_length_is_reusable(cache):
    slots = insert_new(cache, list(range(10, 50)))
    for length in (1, 2, 17, 39, 40):
        match = cache.match_prefix(list(range(10, 10 + length)) + [999])
        assert torch.equal(match.slots, slots[:length])


def test_long_edges_find_the_exact_mismatch(cache, allocator):
    key = list(range(100, 140))
    slots = insert_new(cache, key)
    for mismatch_at in (1, 16, 17, 31, 39):
        probe = key[:mismatch_at] + [7] + key[mismatch_at + 1 :]
        assert torch.equal(cache.match_prefix(probe).slots, slots[:mismatch_at])


def test_miss_and_empty_key(cache):
    insert_new(cache, [1, 2])
    assert cache.match_prefix([3, 1, 2]).prefix_len == 0
    assert cache.match_prefix([]).prefix_len == 0
    assert cache.insert([], torch.empty(0, dtype=torch.int64)) == 0


def test_insert_of_a_prefix_splits_without_new_leaf(cache):
    insert_new(cache, [1, 2, 3, 4])
    duplicate = cache.slot_allocator.alloc(2)
    assert cache.insert([1, 2], duplicate) == 2
    cache.slot_allocator.free(duplicate)
    assert cache.total_size() == 4
    assert cache.match_prefix([1, 2]).last_node.key == (1, 2)
    assert_slots_conserved(cache)


def test_keys_may_be_tensors_and_slots_int32_views(cache, allocator):
    pool = ReqToTokenPool(2, 16)
    row = pool.alloc(1)[0]
    slots = allocator.alloc(5)
    pool.req_to_token[row, :5] = slots.to(torch.int32)
    assert cache.insert(torch.tensor([4, 5, 6, 7, 8]), pool.req_to_token[row, :5]) == 0
    pool.req_to_token[row].zero_()  # the tree copied the slots, so reusing the row is safe
    assert torch.equal(cache.match_prefix((4, 5, 6)).slots, slots[:3])


def test_lock_protects_the_path_and_counts_sizes(cache):
    insert_new(cache, [1, 2, 3, 4])
    insert_new(cache, [1, 2, 7, 8, 9])
    match = cache.match_prefix([1, 2, 7, 8, 9])
    assert (cache.evictable_size(), cache.protected_size()) == (7, 0)
    cache.inc_lock_ref(match.last_node)
    assert (cache.evictable_size(), cache.protected_size()) == (2, 5)
    cache.inc_lock_ref(match.last_node)
    cache.dec_lock_ref(match.last_node)
    assert (cache.evictable_size(), cache.protected_size()) == (2, 5)
    assert cache.evict(100) == 2  # only the unlocked [3, 4] branch
    assert torch.equal(cache.match_prefix([1, 2, 7, 8, 9]).slots, match.slots)
    cache.dec_lock_ref(match.last_node)
    assert (cache.evictable_size(), cache.protected_size()) == (5, 0)
    with pytest.raises(ValueError, match="not locked"):
        cache.dec_lock_ref(match.last_node)
    cache.check_invariants()


def test_split_of_a_locked_edge_keeps_counts(cache):
    insert_new(cache, [1, 2, 3, 4])
    locked = cache.match_prefix([1, 2, 3, 4]).last_node
    cache.inc_lock_ref(locked)
    cache.match_prefix([1, 2, 9])  # splits the locked edge
    assert cache.protected_size() == 4
    cache.check_invariants()
    cache.dec_lock_ref(locked)
    assert (cache.evictable_size(), cache.protected_size()) == (4, 0)


def test_evict_is_lru_and_parents_become_leaves(cache, allocator):
    insert_new(cache, [1, 2, 3])  # oldest
    insert_new(cache, [1, 2, 4])
    insert_new(cache, [5, 6])
    cache.match_prefix([1, 2, 3])  # [1, 2, 3] is now the most recent
    free_before = allocator.available_size()
    assert cache.evict(1) == 1  # the leaf [4] is the least recently used
    assert cache.match_prefix([1, 2, 4]).prefix_len == 2
    assert cache.evict(2) == 2  # then [5, 6]
    assert cache.match_prefix([5, 6]).prefix_len == 0
    assert cache.evict(3) == 3  # [3] and then its parent [1, 2], now a leaf
    assert cache.total_size() == 0
    assert allocator.available_size() == free_before + 6
    assert cache.stats.num_evicted_tokens == 6
    assert_slots_conserved(cache)


def test_evict_frees_whole_leaves_and_stops_when_nothing_is_evictable(cache):
    insert_new(cache, [1, 2, 3, 4, 5])
    assert cache.evict(2) == 5  # a leaf is freed as a whole
    assert cache.evict(10) == 0
    with pytest.raises(ValueError, match="num_tokens"):
        cache.evict(-1)


def test_locking_an_evicted_node_raises(cache):
    insert_new(cache, [1, 2, 3])
    node = cache.match_prefix([1, 2, 3]).last_node
    cache.evict(3)
    with pytest.raises(ValueError, match="evicted"):
        cache.inc_lock_ref(node)


def test_namespaces_share_nothing(cache):
    default_slots = insert_new(cache, [1, 2, 3])
    tenant_slots = insert_new(cache, [1, 2, 3], namespace=("tenant-a", "lora-1"))
    assert cache.total_size() == 6
    assert cache.match_prefix([1, 2, 3], namespace="other").prefix_len == 0
    assert torch.equal(cache.match_prefix([1, 2, 3]).slots, default_slots)
    match = cache.match_prefix([1, 2, 3], namespace=("tenant-a", "lora-1"))
    assert torch.equal(match.slots, tenant_slots)
    with pytest.raises(TypeError, match="namespace"):
        cache.match_prefix([1], namespace=["unhashable"])
    assert_slots_conserved(cache)


def test_empty_namespace_subtrees_are_dropped_on_eviction(cache):
    for salt in range(5):
        insert_new(cache, [1, 2], namespace=f"salt-{salt}")
    assert cache.evict(10) == 10
    assert "salt-3" not in cache.pretty_print()
    assert_slots_conserved(cache)


def test_request_lifecycle_frees_each_duplicate_once(cache, allocator):
    """Two requests compute the same prompt concurrently; the second one's copy is freed."""
    pool = ReqToTokenPool(4, 32)
    prompt = [11, 12, 13, 14, 15, 16]
    reqs = []
    for _ in range(2):
        match = cache.match_prefix(prompt[:-1])
        assert match.prefix_len == 0  # neither is cached yet
        cache.inc_lock_ref(match.last_node)
        row = pool.alloc(1)[0]
        pool.req_to_token[row, : len(prompt)] = allocator.alloc(len(prompt)).to(torch.int32)
        reqs.append((row, match))
    # Chunked prefill: both cache their first 4 tokens; the second finds them cached.
    live = []
    for i, (row, match) in enumerate(reqs):
        result = cache.cache_unfinished_req(
            token_ids=prompt[:4],
            slots=pool.req_to_token[row, :4],
            prefix_len=match.prefix_len,
            last_node=match.last_node,
        )
        assert result.prefix_len == 4 and result.last_node.lock_ref >= 1
        pool.req_to_token[row, :4] = result.slots.to(torch.int32)
        reqs[i] = (row, result)
        live.append(pool.req_to_token[row, 4 : len(prompt)].long())
    assert torch.equal(pool.req_to_token[reqs[0][0], :4], pool.req_to_token[reqs[1][0], :4])
    assert cache.protected_size() == 4
    assert_slots_conserved(cache, *live)
    for row, result in reqs:
        cache.cache_finished_req(
            token_ids=prompt,
            slots=pool.req_to_token[row, : len(prompt)],
            prefix_len=result.prefix_len,
            last_node=result.last_node,
        )
        pool.free(row)
    assert (cache.total_size(), cache.protected_size()) == (6, 0)
    assert_slots_conserved(cache)


def test_finished_request_with_a_wrong_prefix_is_rejected(cache, allocator):
    slots = allocator.alloc(3)
    with pytest.raises(ValueError, match="prefix_len"):
        cache.cache_finished_req(
            token_ids=[1, 2, 3], slots=slots, prefix_len=2, last_node=cache.root
        )
    assert cache.total_size() == 0  # nothing was given to the tree
    with pytest.raises(ValueError, match="prefix_len"):
        cache.cache_finished_req(
            token_ids=[1, 2, 3], slots=slots, prefix_len=4, last_node=cache.root
        )


def test_bad_arguments_name_the_argument(cache, allocator):
    with pytest.raises(ValueError, match="slots"):
        cache.insert([1, 2, 3], allocator.alloc(2))
    with pytest.raises(TypeError, match="slots"):
        cache.insert([1, 2], torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="key"):
        cache.match_prefix("abc")
    with pytest.raises(TypeError, match="node"):
        cache.inc_lock_ref("root")
    with pytest.raises(TypeError, match="slot_allocator"):
        RadixCache(object())
    cache.check_invariants()


def test_stats_and_hit_rate(cache):
    insert_new(cache, [1, 2, 3, 4])
    cache.match_prefix([1, 2, 3, 4])  # 4 of 4
    cache.match_prefix([1, 2, 9, 9])  # 2 of 4
    cache.match_prefix([1, 2, 3], count_in_stats=False)  # a scheduling probe
    stats = cache.stats
    assert (stats.num_lookups, stats.num_lookup_tokens, stats.num_matched_tokens) == (2, 8, 6)
    assert stats.hit_rate == pytest.approx(0.75)
    assert stats.num_inserted_tokens == 4


def test_reset_frees_everything(cache, allocator):
    insert_new(cache, [1, 2, 3])
    insert_new(cache, [4, 5], namespace="n")
    node = cache.match_prefix([1, 2]).last_node
    cache.inc_lock_ref(node)
    with pytest.raises(RuntimeError, match="lock"):
        cache.reset()
    cache.dec_lock_ref(node)
    cache.reset()
    assert allocator.available_size() == allocator.capacity
    assert cache.total_size() == 0 and cache.stats.num_lookups == 0
    assert cache.match_prefix([1, 2, 3]).prefix_len == 0


def test_pretty_print_shows_edges_locks_and_namespaces(cache):
    insert_new(cache, list(range(1, 21)))
    insert_new(cache, [1, 2, 99], namespace="tenant")
    cache.inc_lock_ref(cache.match_prefix([1, 2, 3]).last_node)
    text = cache.pretty_print(max_tokens=4)
    assert "namespace='tenant'" in text
    assert "tokens=[1, 2, 3] " in text and "lock_ref=1" in text
    assert "tokens=[4, 5, 6, 7, ...]" in text


def test_disabled_mode_shares_nothing_and_leaks_nothing(allocator):
    cache = RadixCache(allocator, disabled=True)
    pool = ReqToTokenPool(2, 16)
    prompt = [1, 2, 3, 4, 5]
    match = cache.match_prefix(prompt)
    assert match.prefix_len == 0
    cache.inc_lock_ref(match.last_node)
    row = pool.alloc(1)[0]
    pool.req_to_token[row, :5] = allocator.alloc(5).to(torch.int32)
    result = cache.cache_unfinished_req(
        token_ids=prompt[:3],
        slots=pool.req_to_token[row, :3],
        prefix_len=0,
        last_node=match.last_node,
    )
    # The request keeps its own slots; nothing is freed while it runs.
    assert torch.equal(result.slots, pool.req_to_token[row, :3].long())
    assert allocator.available_size() == allocator.capacity - 5
    cache.cache_finished_req(
        token_ids=prompt,
        slots=pool.req_to_token[row, :5],
        prefix_len=result.prefix_len,
        last_node=result.last_node,
    )
    assert allocator.available_size() == allocator.capacity
    assert cache.total_size() == 0
    assert cache.match_prefix(prompt).prefix_len == 0
    assert cache.stats.num_lookups == 2 and cache.stats.hit_rate == 0.0
    # insert keeps nothing: the caller frees all of it, as it frees duplicates.
    slots = allocator.alloc(2)
    num_cached = cache.insert([1, 2], slots)
    assert num_cached == 2
    allocator.free(slots[:num_cached])
    assert allocator.available_size() == allocator.capacity


def test_lru_heap_compaction_keeps_the_order(cache):
    insert_new(cache, [1, 2, 3])
    insert_new(cache, [7, 8])
    for _ in range(200):  # each hit of a leaf pushes a heap entry; stale ones get compacted
        cache.match_prefix([1, 2, 3])
    cache.check_invariants()
    assert len(cache._leaf_heap) < 100
    assert cache.evict(1) == 2  # [7, 8] is still the least recently used
    assert cache.match_prefix([1, 2, 3]).prefix_len == 3
