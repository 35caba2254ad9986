"""Programmatic dependent launch (kernels/pdl.py): where it is used, and on the GPU, a CUDA
graph of PDL kernels computing what the same kernels compute one by one without it."""

from __future__ import annotations

import pytest
import torch

from radixgen.kernels.pdl import pdl_launch_options, pdl_supported

needs_hopper = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
    reason="needs a Hopper GPU",
)


def test_pdl_only_on_cuda_from_hopper():
    cpu = torch.device("cpu")
    assert not pdl_supported(cpu)
    assert pdl_launch_options(cpu) == {}
    assert pdl_launch_options(cpu, enabled=False) == {}
    with pytest.raises(ValueError, match="PDL"):
        pdl_launch_options(cpu, enabled=True)


@pytest.mark.gpu
@needs_hopper
def test_pdl_on_hopper_unless_the_environment_turns_it_off(monkeypatch):
    cuda = torch.device("cuda")
    assert pdl_launch_options(cuda) == {"USE_PDL": True, "launch_pdl": True}
    monkeypatch.setenv("RADIXGEN_PDL", "0")
    assert pdl_launch_options(cuda) == {}
    with pytest.raises(ValueError, match="PDL"):
        pdl_launch_options(cuda, enabled=True)


@pytest.mark.gpu
@needs_hopper
def test_a_graph_of_pdl_kernels_matches_the_kernels_run_alone():
    """A decode layer's chain (add + RMSNorm, GEMV, rotary + KV store, decode attention, GEMV,
    add + RMSNorm, GEMV, SiLU-and-mul, GEMV), each kernel waiting for the previous one only
    through PDL, replayed from a CUDA graph and run eagerly: the same bits as the kernels run
    one at a time (a host sync after each), every replay."""
    from radixgen.kernels.activation import silu_and_mul
    from radixgen.kernels.decode_attention import decode_attention
    from radixgen.kernels.gemv import GemvConfig, gemv
    from radixgen.kernels.rms_norm import fused_add_rms_norm
    from radixgen.kernels.rotary import rotary_embedding_and_store_kv

    assert pdl_supported(torch.device("cuda"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden, heads, kv_heads, dim, inter, context = 4096, 32, 8, 128, 14336, 1000

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device="cuda") * scale).to(torch.bfloat16)

    w_qkv = randn((heads + 2 * kv_heads) * dim, hidden, scale=0.02)
    w_o, w_up, w_down = (
        randn(hidden, heads * dim, scale=0.02),
        randn(2 * inter, hidden, scale=0.02),
        randn(hidden, inter, scale=0.02),
    )
    norm = randn(hidden)
    k_cache, v_cache = randn(context + 1, kv_heads, dim), randn(context + 1, kv_heads, dim)
    req_to_token = torch.arange(context + 1, device="cuda", dtype=torch.int32)[None, 1:]
    pos = torch.arange(1024, device="cuda", dtype=torch.float32)
    inv_freq = 1.0 / (500000 ** (torch.arange(0, dim, 2, device="cuda").float() / dim))
    angles = torch.outer(pos, inv_freq).repeat(1, 2)
    cos, sin = angles.cos().contiguous(), angles.sin().contiguous()
    config = GemvConfig(block_n=16, block_k=256, split_k=4, num_warps=4)
    counters = torch.zeros(4096, dtype=torch.int32, device="cuda")
    x, residual = randn(1, hidden), randn(1, hidden)
    positions = torch.tensor([context - 1], device="cuda")
    slots = torch.tensor([context], device="cuda")
    seq_lens = torch.tensor([context], device="cuda")
    merge_counters = torch.zeros(kv_heads, dtype=torch.int32, device="cuda")

    def layer(alone: bool):
        # alone: each kernel starts after the previous one has finished (a host sync between).
        def step(value):
            if alone:
                torch.cuda.synchronize()
            return value

        h, res = step(fused_add_rms_norm(x, residual, norm, 1e-5))
        qkv = step(gemv(h, w_qkv, config, counters))
        q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=1)
        q, _ = step(
            rotary_embedding_and_store_kv(
                positions, q.view(1, heads, dim), k.view(1, kv_heads, dim),
                v.view(1, kv_heads, dim), cos, sin, k_cache, v_cache, slots,
            )
        )  # fmt: skip
        attn = step(
            decode_attention(
                q, k_cache, v_cache, req_to_token, torch.zeros_like(seq_lens), seq_lens,
                dim**-0.5, merge_counters=merge_counters,
            )
        )  # fmt: skip
        o = step(gemv(attn.view(1, -1), w_o, config, counters))
        h, res = step(fused_add_rms_norm(o, res, norm, 1e-5))
        gate_up = step(gemv(h, w_up, config, counters))
        return step(gemv(step(silu_and_mul(gate_up)), w_down, config, counters)), res

    alone = layer(alone=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = layer(alone=False)
    for _ in range(20):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured[0], alone[0]) and torch.equal(captured[1], alone[1])
    chained = layer(alone=False)  # eager, PDL between the kernels
    assert torch.equal(chained[0], alone[0]) and torch.equal(chained[1], alone[1])
    assert alone[0].float().abs().sum() > 0
