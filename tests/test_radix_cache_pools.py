"""Tests of the KV memory pools: slot allocator, request-to-token table, KV buffers, budget."""

import pytest
import torch

from radixgen.radix_cache import KVBudget, ReqToTokenPool, SlotAllocator, TokenToKVPool


def test_slot_allocator_never_hands_out_the_padding_slot():
    allocator = SlotAllocator(9)
    assert allocator.capacity == allocator.available_size() == 8
    slots = allocator.alloc(8)
    assert slots.dtype == torch.int64
    assert sorted(slots.tolist()) == list(range(1, 9))
    assert allocator.alloc(1) is None
    assert allocator.alloc(0).numel() == 0


def test_slot_allocator_reuses_freed_slots_and_refuses_when_short():
    allocator = SlotAllocator(11)
    first = allocator.alloc(6)
    assert allocator.alloc(5) is None  # refused, and nothing taken
    assert allocator.available_size() == 4
    allocator.free(first[:3].to(torch.int32))  # int32 views of req_to_token are fine
    allocator.free(first[3:])
    assert allocator.available_size() == 10
    again = allocator.alloc(10)  # needs the freed slots merged back
    assert sorted(again.tolist()) == list(range(1, 11))
    assert allocator.available_size() == 0


def test_slot_allocator_free_copies_its_input():
    allocator = SlotAllocator(5)
    row = torch.zeros(4, dtype=torch.int32)
    row[:] = allocator.alloc(4).to(torch.int32)
    allocator.free(row)
    row.zero_()  # the caller reuses its req_to_token row
    assert sorted(allocator.free_slot_indices().tolist()) == [1, 2, 3, 4]


def test_slot_allocator_bad_arguments():
    with pytest.raises(ValueError, match="num_slots"):
        SlotAllocator(1)
    allocator = SlotAllocator(4)
    with pytest.raises(ValueError, match="num_tokens"):
        allocator.alloc(-1)
    with pytest.raises(TypeError, match="slots"):
        allocator.free(torch.tensor([1.0]))
    with pytest.raises(TypeError, match="slots"):
        allocator.free([1, 2])
    allocator.clear()
    assert allocator.available_size() == 3


def test_req_to_token_pool_rows():
    pool = ReqToTokenPool(3, 8)
    assert pool.req_to_token.shape == (3, 8) and pool.req_to_token.dtype == torch.int32
    rows = pool.alloc(2)
    assert pool.alloc(2) is None and pool.available_size() == 1
    pool.free(rows[0])
    with pytest.raises(ValueError, match="row"):
        pool.free(rows[0])  # double free
    with pytest.raises(ValueError, match="row"):
        pool.free([7])  # out of range
    pool.free([rows[1]])
    assert pool.available_size() == 3
    with pytest.raises(ValueError, match="max_context_len"):
        ReqToTokenPool(2, 0)


def test_token_to_kv_pool_writes_in_its_storage_dtype():
    pool = TokenToKVPool(
        num_slots=6,
        num_layers=2,
        num_kv_heads=2,
        head_dim=4,
        dtype=torch.float32,
        kv_dtype=torch.bfloat16,
    )
    assert pool.store_dtype == torch.bfloat16
    k = torch.randn(3, 2, 4)
    v = torch.randn(3, 2, 4)
    slots = torch.tensor([5, 1, 3])
    pool.set_kv(1, slots, k, v)
    k_buffer, v_buffer = pool.get_kv_buffer(1)
    assert k_buffer.shape == (6, 2, 4) and k_buffer.dtype == torch.bfloat16
    torch.testing.assert_close(k_buffer[slots].float(), k.bfloat16().float())
    torch.testing.assert_close(v_buffer[slots].float(), v.bfloat16().float())
    assert k_buffer[[0, 2, 4]].abs().sum() == 0  # untouched slots, and layer 0
    assert pool.get_kv_buffer(0)[0].abs().sum() == 0
    with pytest.raises(ValueError, match="head_dim"):
        TokenToKVPool(num_slots=4, num_layers=1, num_kv_heads=1, head_dim=0, dtype=torch.float32)


def test_kv_budget():
    per_token = TokenToKVPool.bytes_per_token(2, 4, 8, torch.float16)
    assert per_token == 2 * 2 * 4 * 8 * 2
    assert KVBudget(num_tokens=100).resolve(bytes_per_token=per_token, device="cpu") == 101
    assert KVBudget(num_bytes=per_token * 50).resolve(bytes_per_token=per_token, device="cpu") == 50
    with pytest.raises(ValueError, match="exactly one"):
        KVBudget().resolve(bytes_per_token=per_token, device="cpu")
    with pytest.raises(ValueError, match="exactly one"):
        KVBudget(num_tokens=4, num_bytes=4).resolve(bytes_per_token=per_token, device="cpu")
    with pytest.raises(ValueError, match="num_tokens"):
        KVBudget(num_tokens=0).resolve(bytes_per_token=per_token, device="cpu")
    with pytest.raises(ValueError, match="CUDA"):
        KVBudget(fraction_of_free_memory=0.5).resolve(bytes_per_token=per_token, device="cpu")
