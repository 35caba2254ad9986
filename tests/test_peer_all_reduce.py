"""The small-message all-reduce over CUDA peer memory (runtime/peer_all_reduce.py): which messages
take it (CPU), the flag that turns it off, and on two GPUs the same sums as NCCL, eager and
inside a CUDA graph."""

from __future__ import annotations

import multiprocessing

import pytest
import torch

from radixgen.runtime.cli import build_parser, server_args_from_namespace
from radixgen.runtime.peer_all_reduce import (
    DEFAULT_MAX_BYTES,
    ONE_SHOT_MAX_BYTES,
    choose_all_reduce,
)
from radixgen.runtime.server.subprocess_launcher import find_free_port


@pytest.mark.parametrize(
    "num_bytes,dtype,path",
    [
        (8 << 10, torch.bfloat16, "one_shot"),  # batch 1 of an 8B model: [1, 4096] bf16
        (ONE_SHOT_MAX_BYTES, torch.float16, "one_shot"),
        (2 << 20, torch.bfloat16, "two_shot"),  # [256, 4096] bf16
        (DEFAULT_MAX_BYTES, torch.float32, "two_shot"),
        (DEFAULT_MAX_BYTES + 128, torch.bfloat16, "nccl"),  # large: NCCL's bandwidth
        (8 << 10, torch.int64, "nccl"),  # a dtype the kernels do not sum
        (8 << 10 | 8, torch.bfloat16, "nccl"),  # not whole 16-byte vectors
        ((1 << 20) + 16, torch.bfloat16, "nccl"),  # two-shot slices would not align
    ],
)
def test_which_messages_take_peer_memory(num_bytes, dtype, path):
    assert choose_all_reduce(num_bytes, dtype, DEFAULT_MAX_BYTES) == path


def test_disable_custom_all_reduce_flag():
    def args(*flags):
        return server_args_from_namespace(build_parser().parse_args(["serve", *flags]))

    assert not args().disable_custom_all_reduce
    assert args("--disable-custom-all-reduce").disable_custom_all_reduce


def _rank(rank: int, port: int, answers) -> None:
    from radixgen.runtime.distributed import destroy_tensor_parallel, init_tensor_parallel

    parallel = init_tensor_parallel(
        rank=rank,
        size=2,
        init_method=f"tcp://127.0.0.1:{port}",
        device=torch.device("cuda", rank),
        peer_all_reduce=True,
    )
    results = {"peer": parallel.peer_all_reduce is not None}
    generator = torch.Generator().manual_seed(rank)
    for numel in (4096, 1 << 20, 5 << 20):  # one-shot, two-shot, NCCL (bf16)
        x = torch.randn(numel, generator=generator).to(device=f"cuda:{rank}", dtype=torch.bfloat16)
        expected = x.clone()
        torch.distributed.all_reduce(expected, group=parallel.group)  # NCCL
        ours = parallel.all_reduce(x.clone())
        # Two ranks: a + b in either order, the same bits.
        results[f"eager_{numel}"] = torch.equal(ours, expected)
    # Captured in a CUDA graph, replayed on new values.
    static = torch.zeros(4096, device=f"cuda:{rank}", dtype=torch.bfloat16)
    parallel.all_reduce(static)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        parallel.all_reduce(static)
    static.copy_(torch.full_like(static, float(rank + 1)))
    graph.replay()
    torch.cuda.synchronize()
    results["graph"] = bool((static == 3.0).all())  # 1 + 2
    answers.put((rank, results))
    destroy_tensor_parallel(parallel)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_sum_as_nccl_eager_and_in_a_graph():
    context = multiprocessing.get_context("spawn")
    answers = context.Queue()
    port = find_free_port()
    workers = [context.Process(target=_rank, args=(rank, port, answers)) for rank in (0, 1)]
    for worker in workers:
        worker.start()
    results = dict(answers.get(timeout=300) for _ in workers)
    for worker in workers:
        worker.join(timeout=60)
    for rank in (0, 1):
        assert results[rank] == {
            "peer": True,
            "eager_4096": True,
            "eager_1048576": True,
            "eager_5242880": True,
            "graph": True,
        }, (rank, results[rank])
