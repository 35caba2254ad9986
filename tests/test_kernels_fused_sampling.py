"""fused_sample (one Triton launch) against the torch sampler's math, on the interpreter and CUDA.

The kernel and the reference share the counter-based uniform, so they must pick the same token
for every row; on CPU (fp32, small vocabularies) that holds exactly. On the GPU (bf16 at 128k
tokens) a row may differ only at a floating-point tie: the draw lands within rounding of a
boundary, or equal probabilities straddle a top-k/top-p cut.
"""

# TRITON_INTERPRET=1 on CPU-only machines is set by tests/conftest.py

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from radixgen.kernels.fused_sampling import fused_sample, fused_sample_ref, sampling_probs_ref
from radixgen.kernels.sampling_torch import counter_uniform
from radixgen.runtime.bench.sampling import KINDS, batch_info
from radixgen.runtime.req import Req
from radixgen.runtime.request_schema import SamplingParams
from radixgen.runtime.sampler import Sampler
from radixgen.runtime.sampling_batch_info import SamplingBatchInfo
from radixgen.runtime.server_args import ServerArgs


def random_batch(batch, vocab, *, filters, mask, gen, device="cpu", dtype=torch.float32):
    """Logits and per-row sampling arguments: greedy and sampled rows mixed; `filters` in
    {"none", "min_p", "top_k_top_p", "all"}; `mask`: packed bitmask rows of varied density
    (all ones, half, a handful, exactly one token)."""

    def pick(choices, dtype):
        index = torch.randint(len(choices), (batch,), generator=gen)
        return torch.tensor(choices, dtype=dtype)[index].to(device)

    scales = torch.rand(batch, 1, generator=gen) * 4 + 0.5  # flat to peaked rows
    logits = (torch.randn(batch, vocab, generator=gen) * scales).to(device=device, dtype=dtype)
    args = dict(
        temperatures=pick([0.0, 0.5, 0.8, 1.0, 1.0, 1.7], torch.float32),
        seeds=torch.randint(-(2**62), 2**62, (batch,), generator=gen).to(device),
        steps=torch.randint(0, 10_000, (batch,), generator=gen).to(device),
    )
    if filters in ("min_p", "all"):
        args["min_ps"] = pick([0.0, 0.0, 0.02, 0.1, 0.5], torch.float32)
    if filters in ("top_k_top_p", "all"):
        args["top_ks"] = pick([vocab, vocab, 1, 2, 7, 50, vocab - 1], torch.int64)
        args["top_ps"] = pick([1.0, 1.0, 0.95, 0.8, 0.5, 0.1], torch.float32)
    if mask:
        args["bitmask"] = random_bitmask(batch, vocab, gen).to(device)
    return logits, args


def random_bitmask(batch, vocab, gen):
    num_words = (vocab + 31) // 32
    allowed = torch.ones(batch, num_words * 32, dtype=torch.bool)
    for row in range(batch):
        kind = row % 4
        if kind == 1:
            allowed[row] = torch.rand(num_words * 32, generator=gen) < 0.5
        elif kind == 2:
            allowed[row] = False
            allowed[row, torch.randint(vocab, (5,), generator=gen)] = True
        elif kind == 3:
            allowed[row] = False
            allowed[row, torch.randint(vocab, (1,), generator=gen)] = True
    bits = allowed.view(batch, num_words, 32).to(torch.int64) << torch.arange(32)
    words = bits.sum(-1)  # [batch, num_words] in [0, 2**32)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


@pytest.mark.parametrize(
    "batch,vocab,filters,mask,num_splits",
    [
        (1, 1000, "none", False, 1),
        (9, 1000, "all", True, 3),
        (16, 3001, "none", True, 5),
        (16, 3001, "min_p", False, 1),
        (16, 3001, "min_p", True, 4),
        (24, 2048, "top_k_top_p", False, 1),
        (16, 5000, "top_k_top_p", True, 4),
        (12, 4999, "all", False, 8),
    ],
)
def test_fused_sample_matches_reference(batch, vocab, filters, mask, num_splits):
    """Every batch kind (greedy rows mixed in), one split or several: split partials, the
    radix select across splits and the split-first draw give the torch path's tokens."""
    gen = torch.Generator().manual_seed(batch * vocab)
    logits, args = random_batch(batch, vocab, filters=filters, mask=mask, gen=gen)
    before = logits.clone()
    # 512-token blocks: several blocks per split, so block and split boundaries both occur.
    tokens = fused_sample(logits, **args, num_splits=num_splits, block_size=512)
    assert torch.equal(logits, before)  # logits are read, never written
    assert tokens.tolist() == fused_sample_ref(logits, **args).tolist()


@pytest.mark.parametrize("num_splits", [1, 6])
def test_greedy_batch_with_mask_across_splits(num_splits):
    """All-greedy batches (no seeds) take the masked first argmax, also when the maximum is
    repeated across splits (the first split holding it wins, as torch.argmax)."""
    gen = torch.Generator().manual_seed(9)
    logits, args = random_batch(12, 3000, filters="none", mask=True, gen=gen)
    logits[:3] = logits[:3].round()  # coarse logits: ties for the max in several splits
    logits[3, [100, 1500, 2900]] = 50.0
    expected = fused_sample_ref(logits, temperatures=args["temperatures"], bitmask=args["bitmask"])
    tokens = fused_sample(
        logits,
        temperatures=args["temperatures"],
        bitmask=args["bitmask"],
        num_splits=num_splits,
        block_size=256,
    )
    assert tokens.tolist() == expected.tolist()


def test_all_greedy_batch_takes_masked_argmax():
    gen = torch.Generator().manual_seed(1)
    logits, args = random_batch(12, 1500, filters="none", mask=True, gen=gen)
    expected = fused_sample_ref(logits, temperatures=args["temperatures"], bitmask=args["bitmask"])
    # No seeds: every row is greedy, whatever its temperature.
    tokens = fused_sample(logits, temperatures=args["temperatures"], bitmask=args["bitmask"])
    assert tokens.tolist() == expected.tolist()
    assert tokens.tolist() == sampling_probs_ref(logits, **_no_draw(args))[0].tolist()


def _no_draw(args):
    return {k: v for k, v in args.items() if k not in ("seeds", "steps")}


def test_one_allowed_token_is_always_picked():
    gen = torch.Generator().manual_seed(2)
    batch, vocab = 10, 777
    logits, args = random_batch(batch, vocab, filters="all", mask=False, gen=gen)
    only = torch.randint(vocab, (batch,), generator=gen)
    bitmask = torch.zeros(batch, (vocab + 31) // 32, dtype=torch.int32)
    for row, token in enumerate(only.tolist()):
        bitmask[row, token // 32] = (1 << (token % 32)) - (2**32 if token % 32 == 31 else 0)
    assert fused_sample(logits, **args, bitmask=bitmask).tolist() == only.tolist()
    # No allowed token at all (a grammar always allows one): token 0, as torch's argmax.
    bitmask[:2] = 0
    assert fused_sample(logits, **args, bitmask=bitmask)[:2].tolist() == [0, 0]


def test_draw_is_counter_uniform_bit_for_bit():
    """Flat logits over 4096 tokens: the kernel's pick is floor(u * 4096), so it exposes the
    top 12 bits of its in-kernel uniform, which must be the torch counter_uniform's."""
    batch, vocab = 64, 4096
    gen = torch.Generator().manual_seed(3)
    seeds = torch.randint(-(2**63), 2**63 - 1, (batch,), generator=gen)
    seeds[:4] = torch.tensor([0, 1, 2**32, 2**40 + 1])
    steps = torch.randint(0, 2**40, (batch,), generator=gen)
    tokens = fused_sample(
        torch.zeros(batch, vocab),
        temperatures=torch.ones(batch),
        seeds=seeds,
        steps=steps,
    )
    expected = (counter_uniform(seeds, steps) * vocab).floor().long()
    assert tokens.tolist() == expected.tolist()


def test_ties_at_the_cut_keep_every_tied_token():
    """Four equal maxima and top_k=2: torch's sort keeps two of them arbitrarily; the kernel
    keeps all four (documented), so every draw is one of them and more than two occur."""
    batch = 10
    logits = torch.zeros(batch, 64)
    logits[:, :4] = 5.0
    tokens = fused_sample(
        logits,
        temperatures=torch.ones(batch),
        seeds=torch.arange(batch),
        steps=torch.zeros(batch, dtype=torch.int64),
        top_ks=torch.full((batch,), 2),
        top_ps=torch.ones(batch),
    )
    assert set(tokens.tolist()) == {0, 1, 2, 3}


def test_quantized_logits_differ_from_reference_only_at_ties():
    """Logits on a 1/8 grid (as bf16 logits are, coarser): many equal probabilities, so the
    radix select resolves keys to the last bit; every mismatch must be a tie."""
    gen = torch.Generator().manual_seed(6)
    logits, args = random_batch(24, 2000, filters="all", mask=True, gen=gen)
    logits = (logits * 8).round() / 8
    tokens = fused_sample(logits, **args).tolist()
    expected = fused_sample_ref(logits, **args).tolist()
    mismatched = [row for row in range(24) if tokens[row] != expected[row]]
    for row in mismatched:
        assert mismatch_is_a_tie(logits, args, row, tokens[row]), (row, tokens[row])


def test_fused_sample_rejects_bad_inputs():
    logits = torch.zeros(2, 64)
    ones = torch.ones(2)
    with pytest.raises(ValueError, match="logits"):
        fused_sample(torch.zeros(2, 64, dtype=torch.int32), temperatures=ones)
    with pytest.raises(ValueError, match="temperatures"):
        fused_sample(logits, temperatures=torch.ones(3))
    with pytest.raises(TypeError, match="seeds"):
        fused_sample(logits, temperatures=ones, seeds=ones, steps=torch.zeros(2).long())
    with pytest.raises(ValueError, match="seeds and steps"):
        fused_sample(logits, temperatures=ones, seeds=torch.zeros(2).long())
    with pytest.raises(ValueError, match="top_ks and top_ps"):
        fused_sample(logits, temperatures=ones, top_ks=torch.ones(2).long())
    with pytest.raises(TypeError, match="bitmask"):
        fused_sample(logits, temperatures=ones, bitmask=torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="radix_bits"):
        fused_sample(logits, temperatures=ones, radix_bits=4)


@pytest.mark.slow
def test_every_kernel_variant_compiles_for_sm90_without_spills():
    """Triton's compiler and ptxas for sm_90 (H100/H200) on every variant the host launches, no
    GPU needed (the old min-p variant failed here, in Triton 3.6's TritonGPUCoalesce pass).
    A subprocess: the suite's TRITON_INTERPRET=1 turns @triton.jit into interpreted functions."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    script = Path(__file__).resolve().parent.parent / "scripts" / "compile_fused_sampling_sm90.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert done.stdout.count("\nok ") >= 70, done.stdout


# ---- the runtime's Sampler: the triton backend equals the torch backend -----------------------


def make_req(seed, **params) -> Req:
    return Req(
        rid=f"r{seed}",
        index=0,
        origin_input_ids=[1, 2, 3],
        sampling_params=SamplingParams.from_dict(params),
        sampling_seed=seed,
        eos_token_ids=frozenset({0}),
        output_ids=[4, 4, 5],
    )


def test_sampler_triton_backend_equals_torch_backend():
    vocab = 1200
    reqs = [
        make_req(1, temperature=0),
        make_req(2, temperature=0.9),
        make_req(3, temperature=1.0, top_k=20, top_p=0.9),
        make_req(4, temperature=0.7, min_p=0.05, frequency_penalty=0.5),
        make_req(5, temperature=1.2, top_p=0.5, repetition_penalty=1.3),
        make_req(6, temperature=0),
    ]
    info = SamplingBatchInfo.from_reqs(reqs, vocab, torch.device("cpu"))
    bitmask = torch.full((len(reqs), (vocab + 31) // 32), -1, dtype=torch.int32)
    bitmask[1, :] = 0
    bitmask[1, 3] = 0x0F0F0F0F  # row 1 constrained to 16 tokens of 96..127
    bitmask[5, :10] = 0
    info.vocab_bitmask = bitmask
    info.vocab_bitmask_rows = torch.tensor([1, 5])
    info.banned_rows = torch.tensor([0, 0])
    info.banned_token_ids = torch.tensor([0, 7])
    logits = torch.randn(len(reqs), vocab, generator=torch.Generator().manual_seed(4)) * 3
    triton_sampler = Sampler("triton", "cpu")
    assert triton_sampler.fused_sample is not None and Sampler().fused_sample is None
    for step in range(3):
        steps = torch.full((len(reqs),), step, dtype=torch.int64)
        expected = Sampler("torch")(logits, info, steps).next_token_ids
        got = triton_sampler(logits, info, steps).next_token_ids
        assert got.tolist() == expected.tolist()
        assert 96 <= got[1].item() < 128


@pytest.mark.parametrize("kind", KINDS)
def test_every_benchmark_kind_takes_the_rule_path_and_matches_torch(kind):
    """The sampler's rule: every batch kind in which a row samples goes through the fused
    kernel when the backend has it, all-greedy batches through argmax (faster on the H200);
    either way the torch backend's tokens."""
    batch, vocab = 6, 2000
    torch.manual_seed(11)  # batch_info draws the constrained rows' masks from torch.rand
    info = batch_info(kind, batch, vocab, device="cpu")
    logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(12)) * 3
    steps = torch.arange(batch)
    calls = []
    triton_sampler = Sampler("triton", "cpu")
    kernel = triton_sampler.fused_sample
    triton_sampler.fused_sample = lambda *args, **kwargs: calls.append(1) or kernel(*args, **kwargs)
    got = triton_sampler(logits, info, steps).next_token_ids.tolist()
    assert calls == ([] if info.all_greedy else [1])
    assert got == Sampler("torch")(logits, info, steps).next_token_ids.tolist()


def test_sampling_backend_is_validated():
    with pytest.raises(ValueError, match="sampling_backend"):
        ServerArgs(sampling_backend="cuda")
    assert ServerArgs().sampling_backend == "auto"


def test_triton_sampler_off_cuda_without_the_interpreter_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="sampling_backend='triton' needs a CUDA device"):
        Sampler("triton", "cpu")
    assert Sampler("auto", "cpu").fused_sample is None


# ---- GPU: bf16 at a 128k vocabulary --------------------------------------------------------------


def mismatch_is_a_tie(logits, args, row, token, tolerance=1e-6) -> bool:
    """Whether the kernel's `token` differs from the reference's pick in `row` only by a
    floating-point tie: equal probabilities straddle the top-k/top-p cut, the mass at the cut is
    within `tolerance` (relative) of top_p * total, or the draw is within `tolerance` of the
    boundary between the two picks."""
    one = {k: (v[row : row + 1] if torch.is_tensor(v) else v) for k, v in args.items()}
    x = logits[row : row + 1]
    _, probs = sampling_probs_ref(x, **_no_draw(one))
    probs = probs[0].double()
    if "top_ks" in one:
        before_cut = sampling_probs_ref(x, **_no_draw({**one, "top_ks": None, "top_ps": None}))[1]
        before_cut = before_cut[0].double()
        kept = probs > 0
        dropped = (before_cut > 0) & ~kept
        if dropped.any() and before_cut[kept].min() == before_cut[dropped].max():
            return True
        # Cumulative mass (largest first) before the last kept and the first dropped token.
        cdf = before_cut.sort(descending=True).values.cumsum(0)
        num_kept = int(kept.sum())
        near_cut = cdf[max(num_kept - 2, 0) : num_kept]
        cut = one["top_ps"][0].double() * cdf[-1]
        if ((near_cut - cut).abs() < tolerance * cdf[-1]).any():
            return True
    cdf = probs.cumsum(0)
    target = counter_uniform(one["seeds"], one["steps"])[0].double() * cdf[-1]
    reference = fused_sample_ref(x, **one)[0].item()
    boundary = cdf[min(token, reference)]
    return bool(probs[token] > 0) and abs(boundary - target) < tolerance * cdf[-1]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("filters", ["none", "min_p", "top_k_top_p", "all"])
def test_fused_sample_matches_reference_128k_gpu(filters, dtype):
    batch, vocab = 64, 128256
    gen = torch.Generator().manual_seed(5)
    logits, args = random_batch(
        batch, vocab, filters=filters, mask=True, gen=gen, device="cuda", dtype=dtype
    )
    tokens = fused_sample(logits, **args).tolist()
    expected = fused_sample_ref(logits, **args).tolist()
    mismatched = [row for row in range(batch) if tokens[row] != expected[row]]
    assert len(mismatched) <= batch // 4, mismatched  # ties are rare even in bf16
    for row in mismatched:
        assert mismatch_is_a_tie(logits, args, row, tokens[row]), (row, tokens[row])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("batch", [1, 64, 200])
def test_greedy_masked_argmax_128k_gpu(batch, dtype):
    """All-greedy batches: the masked first argmax exactly, at the default split count."""
    gen = torch.Generator().manual_seed(batch)
    logits, args = random_batch(
        batch, 128256, filters="none", mask=True, gen=gen, device="cuda", dtype=dtype
    )
    temperatures, bitmask = args["temperatures"], args["bitmask"]
    tokens = fused_sample(logits, temperatures=temperatures, bitmask=bitmask)
    expected = fused_sample_ref(logits, temperatures=temperatures, bitmask=bitmask)
    assert tokens.tolist() == expected.tolist()


@pytest.mark.gpu
def test_sampler_defaults_to_the_kernel_on_cuda():
    assert Sampler("auto", "cuda").fused_sample is fused_sample
    assert Sampler("torch", "cuda").fused_sample is None


@pytest.mark.gpu
def test_sampler_backends_agree_on_cuda_128k():
    """The runtime path on the GPU: bans, penalties, a bitmask on some rows, mixed filters."""
    vocab, batch = 128256, 64
    kinds = [
        dict(temperature=0),
        dict(temperature=0.8),
        dict(temperature=1.0, top_p=0.9),
        dict(temperature=0.7, top_k=40, min_p=0.02),
        dict(temperature=1.1, frequency_penalty=0.4),
    ]
    reqs = [make_req(row, **kinds[row % len(kinds)]) for row in range(batch)]
    info = SamplingBatchInfo.from_reqs(reqs, vocab, torch.device("cuda"))
    bitmask = random_bitmask(batch, vocab, torch.Generator().manual_seed(7))
    bitmask[::2] = -1  # even rows unconstrained: all ones, as GrammarHook fills them
    info.vocab_bitmask = bitmask.cuda()
    info.vocab_bitmask_rows = torch.arange(1, batch, 2, device="cuda")
    info.banned_rows = torch.tensor([0, 1, 2], device="cuda")
    info.banned_token_ids = torch.tensor([0, 0, 0], device="cuda")
    gen = torch.Generator().manual_seed(8)
    logits = (torch.randn(batch, vocab, generator=gen) * 3).cuda()
    steps = torch.arange(batch, device="cuda")
    expected = Sampler("torch", "cuda")(logits, info, steps).next_token_ids.tolist()
    got = Sampler("auto", "cuda")(logits, info, steps).next_token_ids.tolist()
    # fp32 logits: ties are rare; allow one floating-point tie among the 64 rows.
    assert sum(a != b for a, b in zip(got, expected, strict=True)) <= 1
