"""The batch-1 GEMV epilogues in the model (`rope_store` on q | k | v, `silu_out` on gate | up,
`add_norm` on o and down): a decode step on the tiny model with every layer's rows marked gives
the logits of the unfused step, and the rotary, norm and activation kernels they replace are
not called (CPU, interpreter)."""

from __future__ import annotations

import torch

from radixgen.kernels.gemv import GemvConfig, gemv_counter_slots
from radixgen.runtime.forward_batch import ForwardMode
from radixgen.runtime.model_runner import ModelRunner
from radixgen.runtime.models import llama
from radixgen.runtime.models.layers import RMSNorm, RotaryEmbedding
from radixgen.runtime.server_args import ServerArgs


def _mark(layer, config: GemvConfig) -> None:
    """Gives a linear layer a batch-1 GEMV row (the GPU's tables are not read on the CPU)."""
    layer.gemv_configs = {1: config}
    slots = gemv_counter_slots(layer.output_size, 4)
    layer.register_buffer("split_k_counters", torch.zeros(slots, dtype=torch.int32), False)
    layer.register_buffer("norm_counters", torch.zeros(4, dtype=torch.int32), False)


def test_decode_step_with_the_fused_epilogues_gives_the_unfused_logits(
    tiny_model_path, monkeypatch
):
    runner = ModelRunner(ServerArgs(model_path=tiny_model_path, device="cpu", max_total_tokens=64))
    prompt = [5, 17, 300, 42, 7]
    rows = runner.req_to_token_pool.alloc(1)
    slots = runner.slot_allocator.alloc(len(prompt) + 1)
    prefill = runner.build_forward_batch(
        mode=ForwardMode.EXTEND, input_ids=[prompt], req_pool_indices=rows, prefix_lens=[0],
        out_cache_loc=slots[:-1],
    )  # fmt: skip
    next_id = int(runner.forward(prefill).argmax(-1))

    def decode() -> torch.Tensor:  # the same position each time (its KV slot rewritten)
        batch = runner.build_forward_batch(
            mode=ForwardMode.DECODE, input_ids=[[next_id]], req_pool_indices=rows,
            prefix_lens=[len(prompt)], out_cache_loc=slots[-1:],
        )  # fmt: skip
        return runner.forward(batch)

    plain = decode()
    for layer in runner.model.model.layers:
        _mark(layer.self_attn.qkv_proj, GemvConfig(64, 128, 2, 4, rope_store=True))
        _mark(layer.self_attn.o_proj, GemvConfig(64, 128, 1, 4, add_norm=True))
        _mark(layer.mlp.gate_up_proj, GemvConfig(128, 128, 2, 4, silu_out=True))
        _mark(layer.mlp.down_proj, GemvConfig(64, 256, 2, 4, add_norm=True))
    calls = {"add_and_norm": 0, "silu": 0, "rotary": 0}
    add_and_norm = RMSNorm.add_and_norm
    rotary = RotaryEmbedding.forward_and_store_kv

    def counted_rotary(self, *args, **kwargs):
        calls["rotary"] += 1
        return rotary(self, *args, **kwargs)

    def counted_add_and_norm(self, *args, **kwargs):
        calls["add_and_norm"] += 1
        return add_and_norm(self, *args, **kwargs)

    silu = llama.F.silu

    def counted_silu(*args, **kwargs):
        calls["silu"] += 1
        return silu(*args, **kwargs)

    monkeypatch.setattr(RMSNorm, "add_and_norm", counted_add_and_norm)
    monkeypatch.setattr(llama.F, "silu", counted_silu)
    monkeypatch.setattr(RotaryEmbedding, "forward_and_store_kv", counted_rotary)
    fused = decode()
    # Every rotary, and every norm after layer 0's input one.
    assert calls == {"add_and_norm": 0, "silu": 0, "rotary": 0}
    torch.testing.assert_close(fused, plain, atol=1e-4, rtol=1e-4)
    assert fused.argmax(-1).tolist() == plain.argmax(-1).tolist()
