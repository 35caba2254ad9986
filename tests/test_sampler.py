"""Sampler unit tests: masks, penalties, counter-based seeded sampling, vocab bitmask."""

from __future__ import annotations

import pytest
import torch

from radixgen.runtime.req import Req
from radixgen.runtime.request_schema import SamplingParams
from radixgen.runtime.sampler import (
    Sampler,
    apply_penalties,
    counter_uniform,
    filter_probs,
    sample_inverse_cdf,
)
from radixgen.runtime.sampling_batch_info import SamplingBatchInfo

VOCAB = 8
DEVICE = torch.device("cpu")


def make_req(seed: int = 0, output_ids=(), input_ids=(1,), **params) -> Req:
    return Req(
        rid="r",
        index=0,
        origin_input_ids=list(input_ids),
        sampling_params=SamplingParams.from_dict(params),
        sampling_seed=seed,
        eos_token_ids=frozenset({0}),
        output_ids=list(output_ids),
    )


def info_for(*reqs: Req) -> SamplingBatchInfo:
    return SamplingBatchInfo.from_reqs(list(reqs), VOCAB, DEVICE)


PROBS = torch.tensor([[0.40, 0.25, 0.15, 0.10, 0.05, 0.03, 0.01, 0.01]])


def kept(probs: torch.Tensor) -> list[int]:
    return torch.nonzero(probs[0] > 0).flatten().tolist()


def test_top_k_keeps_k_most_likely():
    assert kept(filter_probs(PROBS.clone(), info_for(make_req(top_k=3)))) == [0, 1, 2]


def test_top_p_keeps_smallest_prefix_reaching_p():
    # 0.40 + 0.25 = 0.65 < 0.7, adding 0.15 reaches 0.80 >= 0.7.
    assert kept(filter_probs(PROBS.clone(), info_for(make_req(top_p=0.7)))) == [0, 1, 2]
    assert kept(filter_probs(PROBS.clone(), info_for(make_req(top_p=0.01)))) == [0]


def test_min_p_drops_tokens_below_fraction_of_max():
    # threshold 0.3 * 0.40 = 0.12 keeps 0.40, 0.25, 0.15.
    assert kept(filter_probs(PROBS.clone(), info_for(make_req(min_p=0.3)))) == [0, 1, 2]


def test_filters_apply_per_row():
    probs = PROBS.repeat(2, 1)
    info = info_for(make_req(top_k=1), make_req(top_k=-1))
    out = filter_probs(probs, info)
    assert kept(out[:1]) == [0]
    assert kept(out[1:]) == list(range(VOCAB))


def test_penalties():
    logits = torch.tensor([[2.0, -2.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]])
    req = make_req(
        input_ids=[0],
        output_ids=[1, 2, 2],
        repetition_penalty=2.0,
        frequency_penalty=0.5,
        presence_penalty=0.25,
    )
    apply_penalties(logits, info_for(req))
    # token 0: prompt only -> repetition: 2 / 2 = 1.
    # token 1: output once -> -2 * 2 - 0.5 - 0.25 = -4.75.
    # token 2: output twice -> 1 / 2 - 1.0 - 0.25 = -0.75.
    assert logits[0, :4].tolist() == pytest.approx([1.0, -4.75, -0.75, 1.0])


def test_penalty_counts_follow_sampled_tokens_and_batch_changes():
    penalised = make_req(frequency_penalty=1.0, output_ids=[3])
    plain = make_req()
    info = info_for(plain)
    info.merge(info_for(penalised))  # a penalised request joins an unpenalised batch
    info.record_sampled(torch.tensor([5, 3]))
    assert info.output_counts[1, 3].item() == 2
    assert info.output_counts[0, 5].item() == 1
    info.filter([1])
    assert info.output_counts.shape == (1, VOCAB)
    assert info.output_counts[0, 3].item() == 2


def test_penalty_and_bias_state_leaves_with_the_last_row_that_uses_it():
    # The running batch lives on across requests: once the penalised and biased rows are
    # gone, later steps must not keep paying for [batch, vocab] penalty and bias tensors.
    penalised = make_req(repetition_penalty=1.3, output_ids=[3])
    biased = make_req(logit_bias={"4": 5.0})
    info = info_for(make_req(temperature=0), penalised, biased)
    assert info.has_penalties and info.logit_biases is not None
    info.filter([0, 1])  # the biased row finished
    assert info.logit_biases is None and info.has_penalties
    assert info.output_counts[1, 3].item() == 1  # the penalised row's counts are kept
    info.filter([0])  # the penalised row finished
    assert not info.has_penalties and info.seen_tokens is None
    assert info.repetition_penalties is None and info.frequency_penalties is None
    info.merge(info_for(make_req(top_k=3)))  # plain requests join: nothing comes back
    assert not info.has_penalties and info.logit_biases is None
    logits = torch.arange(2 * VOCAB, dtype=torch.float32).reshape(2, VOCAB) % 5
    steps = torch.zeros(2, dtype=torch.int64)
    assert Sampler()(logits, info, steps).next_token_ids[0].item() == 4  # greedy, unpenalised
    info.merge(info_for(penalised))  # a penalised request joins again: its counts are rebuilt
    assert info.has_penalties and info.output_counts[2, 3].item() == 1
    assert info.output_counts[:2].sum().item() == 0


def _flags(info: SamplingBatchInfo) -> tuple[bool, bool, bool]:
    return info.all_greedy, info.need_top_k_or_p, info.need_min_p


def _flags_from_tensors(info: SamplingBatchInfo) -> tuple[bool, bool, bool]:
    info.rows_on_host, kept_rows = None, info.rows_on_host
    info._refresh_flags()  # the device tensors' reading
    flags = _flags(info)
    info.rows_on_host = kept_rows
    info._refresh_flags()
    return flags


def test_batch_flags_follow_filter_and_merge_from_host_rows():
    # The flags come from per-row host records (no read-back of the device tensors, which
    # would wait for the step in flight); they must say what the tensors say.
    greedy, top_p, min_p = make_req(temperature=0), make_req(top_p=0.5), make_req(min_p=0.2)
    info = info_for(greedy, top_p, min_p)
    assert _flags(info) == (False, True, True) == _flags_from_tensors(info)
    info.filter([2, 0])  # min-p and greedy rows, reordered
    assert len(info.rows_on_host) == info.batch_size == 2
    assert _flags(info) == (False, False, True) == _flags_from_tensors(info)
    info.filter([1])
    assert _flags(info) == (True, False, False) == _flags_from_tensors(info)
    info.merge(info_for(make_req(top_k=3)))
    assert _flags(info) == (False, True, False) == _flags_from_tensors(info)
    assert info.top_ks.tolist() == [VOCAB, 3] and info.greedy.tolist() == [True, False]


def test_greedy_rows_take_argmax_even_in_mixed_batch():
    logits = torch.tensor([[0.0, 5.0, 1.0, 0, 0, 0, 0, 0]]).repeat(2, 1)
    info = info_for(make_req(temperature=0), make_req(temperature=1.0, seed=3))
    out = Sampler()(logits, info, torch.tensor([0, 0]))
    assert out.next_token_ids[0].item() == 1


def test_seeded_sampling_is_independent_of_batch_composition():
    torch.manual_seed(0)
    logits = torch.randn(3, VOCAB)
    reqs = [make_req(temperature=1.0, seed=s) for s in (11, 22, 33)]
    steps = torch.tensor([4, 9, 0])
    together = Sampler()(logits, info_for(*reqs), steps).next_token_ids.tolist()
    alone = [
        Sampler()(logits[i : i + 1], info_for(reqs[i]), steps[i : i + 1]).next_token_ids.item()
        for i in range(3)
    ]
    assert together == alone
    again = Sampler()(logits, info_for(*reqs), steps).next_token_ids.tolist()
    assert again == together


def test_sampling_follows_the_distribution():
    # Many seeds at once: empirical frequencies match softmax(logits / temperature).
    num_draws = 20000
    logits = torch.tensor([[1.0, 0.0, -1.0, 2.0, -9.0, -9.0, -9.0, -9.0]])
    expected = torch.softmax(logits[0] / 0.5, dim=0)
    info = SamplingBatchInfo.from_reqs(
        [make_req(temperature=0.5, seed=s) for s in range(num_draws)], VOCAB, DEVICE
    )
    draws = Sampler()(logits.repeat(num_draws, 1), info, torch.zeros(num_draws, dtype=torch.int64))
    freq = torch.bincount(draws.next_token_ids, minlength=VOCAB).float() / num_draws
    assert torch.allclose(freq, expected, atol=0.015)


def test_counter_uniform_changes_with_seed_and_step():
    seeds = torch.tensor([1, 1, 2, 2**40 + 1])
    steps = torch.tensor([0, 1, 0, 0])
    u = counter_uniform(seeds, steps)
    assert ((u >= 0) & (u < 1)).all()
    assert len(set(u.tolist())) == 4
    assert torch.equal(u, counter_uniform(seeds, steps))
    many = counter_uniform(torch.arange(10000), torch.zeros(10000, dtype=torch.int64))
    assert abs(many.mean().item() - 0.5) < 0.01


def test_inverse_cdf_never_picks_excluded_tokens():
    probs = torch.tensor([[0.0, 0.3, 0.0, 0.7, 0.0]]).repeat(5, 1)
    uniform = torch.tensor([0.0, 0.29, 0.43, 0.9999, 1.0 - 2**-53], dtype=torch.float64)
    assert sample_inverse_cdf(probs, uniform).tolist() == [1, 1, 3, 3, 3]


def test_vocab_bitmask_hook_restricts_constrained_rows_only():
    logits = torch.zeros(3, 40)
    logits[:, 0] = 5.0  # the unconstrained favourite
    info = SamplingBatchInfo.from_reqs(
        [make_req(temperature=0), make_req(temperature=1.0, seed=1), make_req(temperature=0)],
        40,
        DEVICE,
    )
    bitmask = torch.full((3, 2), -1, dtype=torch.int32)
    bitmask[0] = 0
    bitmask[0, 0] = 1 << 3  # row 0: only token 3
    bitmask[1] = 0
    bitmask[1, 1] = 1 << 2  # row 1: only token 34
    info.vocab_bitmask = bitmask
    info.vocab_bitmask_rows = torch.tensor([0, 1])
    out = Sampler()(logits, info, torch.tensor([0, 0, 0]))
    assert out.next_token_ids.tolist() == [3, 34, 0]


def test_bans_and_logprobs():
    logits = torch.tensor([[9.0, 1.0, 0.0, 0, 0, 0, 0, 0]])
    info = info_for(make_req(temperature=0))
    info.banned_rows = torch.tensor([0])
    info.banned_token_ids = torch.tensor([0])
    out = Sampler()(logits, info, torch.tensor([0]), return_logprobs=True)
    assert out.next_token_ids.item() == 1
    # Logprobs are of the raw distribution (before bans).
    assert out.logprobs[0].exp().sum().item() == pytest.approx(1.0)
    assert out.logprobs[0, 0].item() == pytest.approx(torch.log_softmax(logits[0], 0)[0].item())


def test_counter_uniform_is_not_degenerate_at_seed_zero():
    # hash32(0) == 0: without the seed salt, seed 0 at step 0 drew ~0.0 (the first token).
    seeds = torch.zeros(4, dtype=torch.int64)
    draws = counter_uniform(seeds, torch.arange(4, dtype=torch.int64))
    assert draws[0] > 1e-3 and len(set(draws.tolist())) == 4
    many = counter_uniform(
        torch.arange(4096, dtype=torch.int64), torch.zeros(4096, dtype=torch.int64)
    )
    assert abs(many.mean().item() - 0.5) < 0.02


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)], ids=["cpu", "cuda"]
)
def test_logit_bias_is_added_per_row_and_survives_filter_and_merge(device):
    device = torch.device(device)
    sampler = Sampler(backend="torch", device=device)
    logits = torch.zeros(3, VOCAB, device=device)
    logits[:, 1] = 5.0
    biased = [
        make_req(temperature=0.0, logit_bias={"3": 10.0}),  # 3 overtakes 1
        make_req(temperature=0.0),  # no bias: 1
        make_req(temperature=0.0, logit_bias={1: -100.0}),
    ]  # 1 banned: the next best 0
    info = SamplingBatchInfo.from_reqs(biased, VOCAB, device)
    assert sampler(logits, info, None).next_token_ids.tolist() == [3, 1, 0]
    info.filter([2, 1])
    assert sampler(logits[:2], info, None).next_token_ids.tolist() == [0, 1]
    plain = SamplingBatchInfo.from_reqs([make_req(temperature=0.0)], VOCAB, device)
    plain.merge(info)  # a batch without biases takes rows with them
    assert sampler(logits, plain, None).next_token_ids.tolist() == [1, 0, 1]
    # A bias never re-allows a token the constraint mask forbids.
    masked = SamplingBatchInfo.from_reqs(biased[:1], VOCAB, device)
    masked.vocab_bitmask = torch.tensor([[0b10]], dtype=torch.int32, device=device)  # only 1
    masked.vocab_bitmask_rows = torch.tensor([0], device=device)
    assert sampler(logits[:1], masked, None).next_token_ids.tolist() == [1]
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams.from_dict({"logit_bias": {"-1": 1.0}})


@pytest.mark.gpu
def test_gpu_batch_changes_do_not_wait_for_the_device():
    # Requests joining and leaving the running batch while a step is in flight.
    device = torch.device("cuda")
    reqs = [make_req(temperature=0), make_req(top_p=0.5, seed=1), make_req(min_p=0.1, seed=2)]
    torch.cuda.set_sync_debug_mode("error")
    try:
        info = SamplingBatchInfo.from_reqs(reqs, VOCAB, device)
        info.filter([2, 0])
        info.merge(SamplingBatchInfo.from_reqs([make_req(top_k=3)], VOCAB, device))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert _flags(info) == (False, True, True)
    assert info.top_ks.tolist() == [VOCAB, VOCAB, 3] and info.seeds.tolist() == [2, 0, 0]
