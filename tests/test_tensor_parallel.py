"""Tensor parallelism on CPU (gloo): TP = 2 and TP = 4 give the logits of TP = 1.

The ranks work as they do when serving: each group's rank 0 builds the batches and broadcasts
them, the others follow (`ModelRunner.follow`). One world of 4 spawned processes serves the
whole module: its 4-rank group is TP = 4, and
its two 2-rank subgroups ([0, 1], [2, 3]) are two TP = 2 instances. Each checks a prefill
(every token's logits) and a decode step on the tiny model and on random Llama/Qwen/Mistral
shapes, including fewer KV heads than ranks (KV heads replicated) and a vocabulary that does
not divide by the ranks. With LoRA adapters, a sequence of batches that mixes adapters, loads
and unloads one while the ranks run and reuses pool slots gives TP = 1's logits too.
"""

from __future__ import annotations

import json
import multiprocessing

import pytest
import torch
import torch.distributed as dist

from radixgen.runtime.distributed import TensorParallel, init_tensor_parallel
from radixgen.runtime.forward_batch import ForwardMode
from radixgen.runtime.model_runner import ModelRunner
from radixgen.runtime.server.subprocess_launcher import find_free_port
from radixgen.runtime.server_args import ServerArgs

WORLD_SIZE = 4
PROMPTS = [[1, 5, 9, 200, 31, 7, 64], [3, 17, 2, 400]]  # ids below every vocab_size
LORA_PROMPTS = [[1, 5, 9, 200, 31, 7, 64], [3, 17, 2, 300], [2, 3]]  # below lora_fixtures'
# Seconds the test waits for the workers' answer to one model.
ANSWER_TIMEOUT_S = 120

# name -> config.json of a dummy-weight model (random weights, identical on every rank).
RANDOM_SHAPES = {
    "llama_gqa_kv_lt_tp": dict(
        architectures=["LlamaForCausalLM"],
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,  # < 4 ranks: replicated
        vocab_size=1001,  # not a multiple of 2 or 4
        tie_word_embeddings=False,
    ),
    "qwen2_bias_one_kv_head": dict(
        architectures=["Qwen2ForCausalLM"],
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        vocab_size=515,
        tie_word_embeddings=True,
    ),
    "qwen3_qk_norm": dict(
        architectures=["Qwen3ForCausalLM"],
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=32,
        vocab_size=600,
        tie_word_embeddings=True,
    ),
    "mistral_llama_bias": dict(
        architectures=["MistralForCausalLM"],
        hidden_size=96,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=12,
        num_key_value_heads=4,
        vocab_size=777,
        attention_bias=False,
        tie_word_embeddings=False,
        sliding_window=None,
    ),
}


def prefill_and_decode_logits(
    runner: ModelRunner, prompts: list[list[int]], lora_slots: list[int] | None = None
) -> torch.Tensor:
    """Every prompt token's logits, then one decode step's: [num_tokens + batch, vocab]."""
    rows = runner.req_to_token_pool.alloc(len(prompts))
    num_tokens = sum(len(p) for p in prompts)
    slots = runner.slot_allocator.alloc(num_tokens)
    extend = runner.build_forward_batch(
        mode=ForwardMode.EXTEND,
        input_ids=prompts,
        req_pool_indices=rows,
        prefix_lens=[0] * len(prompts),
        out_cache_loc=slots,
        return_all_logits=True,
        lora_slots=lora_slots,
    )
    prefill_logits = runner.forward(extend)  # [num_tokens, vocab]
    last = prefill_logits[extend.last_token_indices].argmax(-1)  # [batch]
    decode = runner.build_forward_batch(
        mode=ForwardMode.DECODE,
        input_ids=[[int(token)] for token in last],
        req_pool_indices=rows,
        prefix_lens=[len(p) for p in prompts],
        out_cache_loc=runner.slot_allocator.alloc(len(prompts)),
        lora_slots=lora_slots,
    )
    return torch.cat([prefill_logits, runner.forward(decode)])


def build_runner(
    model_path: str, load_format: str, parallel: TensorParallel, lora: dict | None = None
) -> ModelRunner:
    """`lora`: adapter name -> folder; "all" and "qv" load at start-up into a 2-slot pool."""
    lora_args = {}
    if lora is not None:
        lora_args = dict(
            lora_paths=[f"{name}={lora[name]}" for name in ("all", "qv")],
            lora_target_modules=["all"],
            max_loras_per_batch=2,
            max_lora_rank=16,
        )
    args = ServerArgs(
        model_path=model_path,
        load_format=load_format,
        device="cpu",
        dtype="float32",
        attention_backend="torch",
        max_total_tokens=256,
        max_running_requests=8,
        **lora_args,
    )
    return ModelRunner(args, parallel)


def lora_batches_logits(runner: ModelRunner, lora: dict) -> torch.Tensor:
    """Three batches over a 2-slot pool, as the scheduler would drive it: adapters and the base
    model in one batch; "mlp" loaded while running and put in "all"'s slot (the least recently
    used idle one); "mlp" unloaded, loaded again (a new load id) and "all" back in a slot."""
    manager = runner.lora_manager
    outputs = []
    for names, change in (
        (["all", None, "qv"], None),
        (["mlp", "qv"], "load mlp"),
        (["mlp", "all"], "reload mlp"),
    ):
        if change is not None:
            if change == "reload mlp":
                manager.unload_adapter("mlp")
            manager.load_adapter("mlp", lora["mlp"])
        slots = [-1 if name is None else manager.acquire(name) for name in names]
        prompts = LORA_PROMPTS[: len(names)]
        outputs.append(prefill_and_decode_logits(runner, prompts, slots))
        for name in names:
            if name is not None:
                manager.release(name)
    return torch.cat(outputs)


def _lead_or_follow(runner: ModelRunner, lora: dict | None = None) -> torch.Tensor | None:
    """As in serving: the group's rank 0 builds the batches and gets the logits; the other
    ranks run the batches it broadcasts (runtime/tp_batch_sync.py) until it stops them."""
    if not runner.parallel.is_leader:
        runner.follow()
        return None
    if lora is None:
        logits = prefill_and_decode_logits(runner, PROMPTS)
    else:
        logits = lora_batches_logits(runner, lora)
    runner.stop_followers()
    return logits


def _worker(rank: int, init_method: str, commands, answers) -> None:
    torch.set_num_threads(1)
    world = init_tensor_parallel(
        rank=rank, size=WORLD_SIZE, init_method=init_method, device=torch.device("cpu")
    )
    # Two TP = 2 subgroups; every rank creates both, in the same order (a collective).
    pairs = [dist.new_group([0, 1], backend="gloo"), dist.new_group([2, 3], backend="gloo")]
    pair = pairs[rank // 2]
    half = TensorParallel(rank=rank % 2, size=2, group=pair, cpu_group=pair)
    while True:
        command = commands.get()
        if command is None:
            break
        model_path, load_format, lora = command
        try:
            runner = build_runner(model_path, load_format, world, lora)
            # What this rank holds: its heads, KV heads and vocabulary rows.
            held = (runner.num_local_heads, runner.num_local_kv_heads)
            held += (runner.model.lm_head_weight.shape[0],)
            # The LM head gathered whole from the 4 ranks (what EAGLE's head reads on rank 0).
            whole = runner.model.output_embedding.gathered_weight()
            tp4 = _lead_or_follow(runner, lora)
            tp2 = _lead_or_follow(build_runner(model_path, load_format, half, lora), lora)
            answers.put((rank, tp2, tp4, held, whole, None))
        except Exception as error:  # reported to the test, which fails with it
            answers.put((rank, None, None, None, None, repr(error)))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def tp_world():
    """Runs models on TP = 4 and TP = 2: `run(path, load_format, lora=None) -> {rank: (tp2
    logits, tp4 logits, (heads, KV heads, vocabulary rows) held by the TP = 4 rank, its LM
    head gathered whole)}`; a follower's logits are None. `lora`: adapter folders by name
    (`lora_batches_logits`)."""
    context = multiprocessing.get_context("spawn")
    init_method = f"tcp://127.0.0.1:{find_free_port()}"
    commands = [context.Queue() for _ in range(WORLD_SIZE)]
    answers = context.Queue()
    workers = [
        context.Process(target=_worker, args=(rank, init_method, commands[rank], answers))
        for rank in range(WORLD_SIZE)
    ]
    for worker in workers:
        worker.daemon = True
        worker.start()

    def run(model_path: str, load_format: str, lora: dict | None = None) -> dict[int, tuple]:
        for queue in commands:
            queue.put((model_path, load_format, lora))
        results = {}
        for _ in range(WORLD_SIZE):
            rank, tp2, tp4, held, whole, error = answers.get(timeout=ANSWER_TIMEOUT_S)
            assert error is None, f"rank {rank}: {error}"
            results[rank] = (tp2, tp4, held, whole)
        return results

    yield run
    for queue in commands:
        queue.put(None)
    for worker in workers:
        worker.join(10)
        if worker.is_alive():
            worker.kill()


def _check_equal(
    model_path: str, load_format: str, tp_world, lora: dict | None = None
) -> dict[int, tuple]:
    torch.set_num_threads(1)
    single = build_runner(model_path, load_format, TensorParallel(), lora)
    if lora is None:
        reference = prefill_and_decode_logits(single, PROMPTS)
    else:
        reference = lora_batches_logits(single, lora)
    results = tp_world(model_path, load_format, lora)
    # Logits come from the leaders: rank 0 (TP = 4, and TP = 2 of ranks 0-1) and rank 2.
    assert results[0][1] is not None and results[0][0] is not None
    assert results[2][0] is not None
    for rank, (tp2, tp4, _held, whole) in results.items():
        for name, logits in (("tp2", tp2), ("tp4", tp4)):
            if logits is None:
                continue  # a follower
            assert logits.shape == reference.shape, (rank, name)
            torch.testing.assert_close(logits, reference, atol=1e-5, rtol=1e-5, msg=f"{name}")
        assert torch.equal(whole, single.model.output_embedding.weight), rank
    return {rank: held for rank, (_tp2, _tp4, held, _whole) in results.items()}


def test_tiny_logits_equal_tp1(tp_world, tiny_model_path):
    held = _check_equal(tiny_model_path, "auto", tp_world)
    # tiny: 8 heads, 4 KV heads, 32000 tokens: each of 4 ranks holds a quarter.
    assert held == {rank: (2, 1, 8000) for rank in range(WORLD_SIZE)}


@pytest.mark.parametrize("shape", sorted(RANDOM_SHAPES))
def test_random_shapes_logits_equal_tp1(shape, tp_world, tmp_path):
    config = dict(RANDOM_SHAPES[shape], max_position_embeddings=512, rms_norm_eps=1e-6)
    (tmp_path / "config.json").write_text(json.dumps(config))
    held = _check_equal(str(tmp_path), "dummy", tp_world)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    rows = -(-config["vocab_size"] // WORLD_SIZE)
    for rank, (local_heads, local_kv_heads, local_rows) in held.items():
        assert local_heads == heads // WORLD_SIZE
        assert local_kv_heads == max(1, kv_heads // WORLD_SIZE)
        assert local_rows == min(rows, config["vocab_size"] - rank * rows)


def test_bad_partitions_are_refused():
    parallel = TensorParallel(rank=0, size=4, group=object())
    with pytest.raises(ValueError, match="num_attention_heads"):
        parallel.split(6, "num_attention_heads")
    from radixgen.runtime.models.parallel_layers import kv_head_partition

    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        kv_head_partition(3, TensorParallel(rank=0, size=4, group=object()))
    assert kv_head_partition(2, TensorParallel(rank=3, size=4, group=object())) == (1, 1)
    assert kv_head_partition(8, TensorParallel(rank=3, size=4, group=object())) == (6, 2)


def test_lora_adapters_logits_equal_tp1(tp_world, tmp_path):
    """Adapters on every projection, on q/v only and on the MLP (rank 16, rsLoRA), over a model
    with fewer KV heads than 4 ranks: each rank keeps its cut of every adapter."""
    import transformers
    from lora_fixtures import random_base_model, save_random_adapter

    base = random_base_model(transformers.LlamaConfig)
    base.save_pretrained(tmp_path / "base")
    lora = {
        name: str(save_random_adapter(base, tmp_path / name, name, seed=seed))
        for seed, name in enumerate(("all", "qv", "mlp"))
    }
    base_logits = prefill_and_decode_logits(
        build_runner(str(tmp_path / "base"), "auto", TensorParallel()), LORA_PROMPTS
    )
    with_adapter = lora_batches_logits(
        build_runner(str(tmp_path / "base"), "auto", TensorParallel(), lora), lora
    )
    first_prompt = len(LORA_PROMPTS[0])  # under "all" in the first batch
    assert not torch.allclose(with_adapter[:first_prompt], base_logits[:first_prompt])
    _check_equal(str(tmp_path / "base"), "auto", tp_world, lora)
