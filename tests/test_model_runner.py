"""ModelRunner set-up, the ForwardBatch builder, and generation through the Engine on it."""

from __future__ import annotations

import pytest
import torch

from radixgen.runtime.attention.torch_backend import TorchAttentionBackend
from radixgen.runtime.engine import Engine
from radixgen.runtime.forward_batch import ForwardMode
from radixgen.runtime.model_runner import ModelRunner, resolve_device, resolve_dtype
from radixgen.runtime.server_args import ServerArgs


@pytest.fixture(scope="module")
def runner(tiny_model_path) -> ModelRunner:
    return ModelRunner(ServerArgs(model_path=tiny_model_path, device="cpu", max_total_tokens=600))


def test_runner_setup(runner):
    assert runner.device == torch.device("cpu") and runner.dtype == torch.float32
    assert runner.attn_backend_name == "torch"
    assert isinstance(runner.attn_backend, TorchAttentionBackend)
    assert runner.max_total_num_tokens == 600
    assert runner.slot_allocator.available_size() == 600
    assert runner.token_to_kv_pool.k_buffers[0].shape == (601, 4, 32)
    assert runner.req_to_token_pool.req_to_token.shape == (runner.max_running_requests, 4096)
    assert runner.context_length == 4096 and runner.vocab_size == 32000
    assert runner.eos_token_ids == (2, 0)


def test_default_sizes_and_overrides(tiny_model_path):
    default = ModelRunner(ServerArgs(model_path=tiny_model_path, device="cpu"))
    assert default.max_total_num_tokens == 4 * 4096  # a few contexts on CPU
    assert default.max_running_requests == (4 * 4096 + 1) // 64
    small = ModelRunner(
        ServerArgs(
            model_path=tiny_model_path,
            device="cpu",
            context_length=256,
            max_total_tokens=100,
            max_running_requests=3,
        )
    )
    assert small.req_to_token_pool.req_to_token.shape == (3, 256)


def test_device_and_dtype_resolution():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("float16", torch.device("cpu")) == torch.float16
    with pytest.raises(ValueError, match="device"):
        resolve_device("tpu:what")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")
        assert resolve_device("auto") == torch.device("cpu")


def test_builder_fills_positions_and_req_to_token(runner):
    rows = runner.req_to_token_pool.alloc(2)
    slots = runner.slot_allocator.alloc(7)
    # Request 0: 3 cached tokens + 4 new; request 1: no prefix, 3 new.
    runner.req_to_token_pool.req_to_token[rows[0], :3] = torch.tensor([9, 8, 7])
    batch = runner.build_forward_batch(
        mode=ForwardMode.EXTEND,
        input_ids=[[1, 2, 3, 4], [5, 6, 7]],
        req_pool_indices=rows,
        prefix_lens=[3, 0],
        out_cache_loc=slots,
    )
    assert batch.positions.tolist() == [3, 4, 5, 6, 0, 1, 2]
    assert batch.seq_lens.tolist() == [7, 3] and batch.seq_lens_cpu == [7, 3]
    assert batch.extend_lens_cpu == [4, 3] and batch.prefix_lens_cpu == [3, 0]
    assert batch.last_token_indices.tolist() == [3, 6]
    table = runner.req_to_token_pool.req_to_token
    assert table[rows[0], :7].tolist() == [9, 8, 7, *slots[:4].tolist()]
    assert table[rows[1], :3].tolist() == slots[4:].tolist()
    runner.slot_allocator.free(slots)
    runner.req_to_token_pool.free(rows)


def test_builder_hands_kernels_aligned_index_tensors(runner):
    # Triton compiles a kernel variant per pointer alignment: 7 tokens in 3 requests split the
    # packed host lists at odd offsets, and a slot view starting at an odd index of the
    # allocator's free list is misaligned, unless the builder aligns them.
    rows = runner.req_to_token_pool.alloc(3)
    taken = runner.slot_allocator.alloc(8)
    slots = taken[1:] if taken.data_ptr() % 16 == 0 else taken[:7]  # 7 slots, misaligned
    assert slots.data_ptr() % 16 != 0
    batch = runner.build_forward_batch(
        mode=ForwardMode.EXTEND,
        input_ids=[[1, 2, 3], [4, 5], [6, 7]],
        req_pool_indices=rows,
        prefix_lens=[0, 0, 0],
        out_cache_loc=slots,
    )
    for name in ("input_ids", "req_pool_indices", "prefix_lens", "extend_lens", "out_cache_loc"):
        assert getattr(batch, name).data_ptr() % 16 == 0, name
    assert batch.req_pool_indices.tolist() == rows and batch.extend_lens.tolist() == [3, 2, 2]
    assert batch.prefix_lens.tolist() == [0, 0, 0] and batch.input_ids.tolist() == list(range(1, 8))
    assert torch.equal(batch.out_cache_loc, slots)
    runner.slot_allocator.free(taken)
    runner.req_to_token_pool.free(rows)


def test_decode_batch_packs_as_an_extend_batch_of_one_token_each(runner):
    """DECODE skips extend's per-token packing: its positions, lengths and the slots written
    into `req_to_token` equal an EXTEND batch's of one new token per request (ids on the host
    or already on the device)."""
    rows = runner.req_to_token_pool.alloc(3)
    slots = runner.slot_allocator.alloc(3)
    table = runner.req_to_token_pool.req_to_token
    built = {}
    for mode, ids in (
        (ForwardMode.EXTEND, [[5], [6], [7]]),
        (ForwardMode.DECODE, [[5], [6], [7]]),
        (ForwardMode.DECODE, torch.tensor([5, 6, 7])),
    ):
        table[rows] = -1
        batch = runner.build_forward_batch(
            mode=mode, input_ids=ids, req_pool_indices=rows, prefix_lens=[4, 0, 9],
            out_cache_loc=slots,
        )  # fmt: skip
        written = [int(table[row, position]) for row, position in zip(rows, [4, 0, 9], strict=True)]
        assert written == slots.tolist() and int((table[rows] >= 0).sum()) == 3
        built[(mode, isinstance(ids, torch.Tensor))] = [
            getattr(batch, name).tolist()
            for name in ("input_ids", "positions", "seq_lens", "prefix_lens", "extend_lens")
        ]
    assert built[(ForwardMode.EXTEND, False)] == [[5, 6, 7], [4, 0, 9], [5, 1, 10], [4, 0, 9],
                                                   [1, 1, 1]]  # fmt: skip
    assert len({str(fields) for fields in built.values()}) == 1
    runner.slot_allocator.free(slots)
    runner.req_to_token_pool.free(rows)


def test_builder_rejects_bad_batches(runner):
    common = dict(req_pool_indices=[0], prefix_lens=[0], out_cache_loc=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="exactly one new token"):
        runner.build_forward_batch(mode=ForwardMode.DECODE, input_ids=[[1, 2]], **common)
    with pytest.raises(ValueError, match="out_cache_loc"):
        runner.build_forward_batch(mode=ForwardMode.EXTEND, input_ids=[[1, 2, 3]], **common)
    with pytest.raises(ValueError, match="at least one new token"):
        runner.build_forward_batch(
            mode=ForwardMode.EXTEND,
            input_ids=[[]],
            req_pool_indices=[0],
            prefix_lens=[0],
            out_cache_loc=torch.tensor([], dtype=torch.int64),
        )
    with pytest.raises(ValueError, match="one entry per request"):
        runner.build_forward_batch(
            mode=ForwardMode.EXTEND,
            input_ids=[[1], [2]],
            **common,
        )
    with pytest.raises(ValueError, match="context length"):
        runner.build_forward_batch(
            mode=ForwardMode.DECODE,
            input_ids=[[1]],
            req_pool_indices=[0],
            prefix_lens=[4096],
            out_cache_loc=torch.tensor([1]),
        )
    with pytest.raises(ValueError, match="req_pool_indices"):
        runner.build_forward_batch(
            mode=ForwardMode.EXTEND, input_ids=[[1, 2]], **dict(common, req_pool_indices=[10**6])
        )
    with pytest.raises(TypeError, match="ForwardMode"):
        runner.build_forward_batch(mode="extend", input_ids=[[1, 2]], **common)


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    with Engine(model_path=tiny_model_path, device="cpu", max_total_tokens=600) as engine:
        yield engine


def _output_ids(engine: Engine, prompts: list[list[int]], **params) -> list[list[int]]:
    params = {"temperature": 0, "ignore_eos": True, **params}
    return [out["output_ids"] for out in engine.generate(input_ids=prompts, sampling_params=params)]


def test_batched_generation_equals_one_by_one(engine):
    prompts = [[11, 12, 13, 14, 15], [21, 22], [31, 32, 33]]
    together = _output_ids(engine, prompts, max_new_tokens=6)
    alone = [_output_ids(engine, [p], max_new_tokens=6)[0] for p in prompts]
    assert together == alone
    engine.check_integrity()  # everything given back: slots and rows


def test_stop_tokens_and_sampling(engine):
    prompt = [[40, 41, 42]]
    greedy = _output_ids(engine, prompt, max_new_tokens=5)[0]
    stopped = _output_ids(engine, prompt, max_new_tokens=5, stop_token_ids=[greedy[1]])[0]
    assert stopped == greedy[: greedy.index(greedy[1]) + 1]
    sampled = _output_ids(engine, prompt, max_new_tokens=12, temperature=1.0, seed=3)
    assert sampled == _output_ids(engine, prompt, max_new_tokens=12, temperature=1.0, seed=3)
    assert sampled != _output_ids(engine, prompt, max_new_tokens=12, temperature=1.0, seed=4)
    with pytest.raises(ValueError, match="temperature"):
        _output_ids(engine, prompt, temperature=-1.0)
    with pytest.raises(ValueError, match="KV cache capacity"):
        _output_ids(engine, prompt, max_new_tokens=1000)
    with pytest.raises(ValueError, match="context length"):
        _output_ids(engine, prompt, max_new_tokens=5000)
    engine.check_integrity()
