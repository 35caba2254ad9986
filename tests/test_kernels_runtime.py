"""The Triton attention backend and decode CUDA graphs inside ModelRunner, on the tiny model.

CPU (interpreter): the Triton backend gives the torch backend's logits through a chunked
prefill (prefix > 0) and decode steps. CUDA (marked gpu): the same in bf16, the automatic backend
choice, and decode through CUDA graphs equal to eager decode.
"""


# TRITON_INTERPRET=1 on CPU-only machines is set by tests/conftest.py

import pytest
import torch

from radixgen.runtime.forward_batch import ForwardMode
from radixgen.runtime.model_runner import ModelRunner
from radixgen.runtime.server_args import ServerArgs


def run_steps(runner, prompts, *, first_chunk, num_decode_steps):
    """Prefills `prompts` in two chunks (the second over a cached prefix), then decodes.

    Decode inputs are fixed random tokens rather than each run's argmax, so that two runs whose
    logits differ by rounding (a near tie) still feed the same tokens and stay comparable.
    Returns the logits of every step (two extends, then the decodes).
    """
    batch = len(prompts)
    rows = runner.req_to_token_pool.alloc(batch)
    prefix_lens = [0] * batch
    all_logits = []
    for chunk in ([p[:first_chunk] for p in prompts], [p[first_chunk:] for p in prompts]):
        slots = runner.slot_allocator.alloc(sum(len(ids) for ids in chunk))
        forward_batch = runner.build_forward_batch(
            mode=ForwardMode.EXTEND,
            input_ids=chunk,
            req_pool_indices=rows,
            prefix_lens=prefix_lens,
            out_cache_loc=slots,
        )
        all_logits.append(runner.forward(forward_batch))
        prefix_lens = [p + len(ids) for p, ids in zip(prefix_lens, chunk, strict=True)]
    gen = torch.Generator().manual_seed(len(prompts))
    decode_ids = torch.randint(3, runner.vocab_size, (num_decode_steps, batch), generator=gen)
    for next_ids in decode_ids:
        forward_batch = runner.build_forward_batch(
            mode=ForwardMode.DECODE,
            input_ids=next_ids.view(-1, 1).tolist(),
            req_pool_indices=rows,
            prefix_lens=prefix_lens,
            out_cache_loc=runner.slot_allocator.alloc(batch),
        )
        all_logits.append(runner.forward(forward_batch))
        prefix_lens = [p + 1 for p in prefix_lens]
    return all_logits


def make_runner(model_path, **overrides):
    args = dict(model_path=model_path, max_total_tokens=1024, max_running_requests=16)
    return ModelRunner(ServerArgs(**{**args, **overrides}))


def random_prompts(lengths, vocab_size, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab_size, (n,), generator=gen).tolist() for n in lengths]


def relative_error(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def test_triton_backend_on_cpu_without_the_interpreter_is_a_clear_error(
    tiny_model_path, monkeypatch
):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="attention_backend='triton' needs a CUDA device"):
        make_runner(tiny_model_path, device="cpu", attention_backend="triton")


def test_triton_backend_matches_torch_backend_cpu(tiny_model_path):
    triton_runner = make_runner(tiny_model_path, device="cpu", attention_backend="triton")
    torch_runner = make_runner(tiny_model_path, device="cpu", attention_backend="torch")
    assert type(triton_runner.attn_backend).__name__ == "TritonAttentionBackend"
    assert triton_runner.cuda_graph_runner is None  # CPU: no graphs
    prompts = random_prompts([9, 21], triton_runner.vocab_size)
    got = run_steps(triton_runner, prompts, first_chunk=4, num_decode_steps=2)
    expected = run_steps(torch_runner, prompts, first_chunk=4, num_decode_steps=2)
    for step, (out, ref) in enumerate(zip(got, expected, strict=True)):
        assert relative_error(out, ref) < 1e-4, f"step {step}"


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@gpu
def test_triton_backend_is_default_and_matches_torch_cuda(tiny_model_path):
    triton_runner = make_runner(tiny_model_path, device="cuda", disable_cuda_graph=True)
    assert triton_runner.attn_backend_name == "triton"
    torch_runner = make_runner(tiny_model_path, device="cuda", attention_backend="torch")
    assert torch_runner.cuda_graph_runner is None
    prompts = random_prompts([50, 130, 7], triton_runner.vocab_size)
    got = run_steps(triton_runner, prompts, first_chunk=5, num_decode_steps=4)
    expected = run_steps(torch_runner, prompts, first_chunk=5, num_decode_steps=4)
    for step, (out, ref) in enumerate(zip(got, expected, strict=True)):
        assert relative_error(out, ref) < 2e-2, f"step {step}"


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("batch_size", [4, 3])  # 4 is a captured size; 3 replays padded to 4
def test_cuda_graph_decode_matches_eager(tiny_model_path, batch_size):
    graph_runner = make_runner(tiny_model_path, device="cuda", cuda_graph_max_bs=8)
    eager_runner = make_runner(tiny_model_path, device="cuda", disable_cuda_graph=True)
    assert graph_runner.cuda_graph_runner.batch_sizes == [1, 2, 4, 8]
    assert eager_runner.cuda_graph_runner is None
    prompts = random_prompts([11, 40, 23, 5][:batch_size], graph_runner.vocab_size, seed=1)
    got = run_steps(graph_runner, prompts, first_chunk=3, num_decode_steps=6)
    expected = run_steps(eager_runner, prompts, first_chunk=3, num_decode_steps=6)
    for step, (out, ref) in enumerate(zip(got, expected, strict=True)):
        if batch_size in graph_runner.cuda_graph_runner.batch_sizes:
            max_diff = (out - ref).abs().max().item()
            assert torch.equal(out, ref), f"step {step}: max diff {max_diff}"  # same kernels
        else:  # padded: the matmuls see another row count, so rounding may differ
            assert relative_error(out, ref) < 1e-2, f"step {step}"
