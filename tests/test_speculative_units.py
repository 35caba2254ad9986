"""Speculative decoding's parts: the flags, the NGRAM proposer against a brute-force
reference, and draft verification (greedy acceptance, and rejection sampling that keeps the
target distribution) on hand-made logits."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from radixgen.runtime.cli import build_parser, server_args_from_namespace
from radixgen.runtime.sampling_batch_info import SamplingBatchInfo
from radixgen.runtime.server_args import ServerArgs
from radixgen.runtime.speculative.config import SpeculativeAlgorithm, resolve_speculative_config
from radixgen.runtime.speculative.ngram import propose_ngram
from radixgen.runtime.speculative.verify import build_verify_input, verify_drafts

# ---- flags ---------------------------------------------------------------------------------


def test_flags_parse_case_insensitively_and_draft_tokens_follow_steps():
    namespace = build_parser().parse_args(
        ["serve", "--speculative-algorithm", "ngram", "--speculative-num-steps", "3"]
    )
    config = resolve_speculative_config(server_args_from_namespace(namespace))
    assert config.algorithm is SpeculativeAlgorithm.NGRAM
    assert (config.num_steps, config.num_draft_tokens) == (3, 4)
    by_draft_tokens = ServerArgs(speculative_algorithm="NGRAM", speculative_num_draft_tokens=6)
    assert resolve_speculative_config(by_draft_tokens).num_steps == 5
    assert resolve_speculative_config(ServerArgs()) is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"speculative_algorithm": "medusa"}, "speculative_algorithm must be one of"),
        ({"speculative_algorithm": "eagle"}, "EAGLE' needs speculative_draft_model_path"),
        ({"speculative_algorithm": "standalone"}, "needs speculative_draft_model_path"),
        ({"speculative_algorithm": "ngram", "speculative_eagle_topk": 4}, "eagle_topk must be 1"),
        (
            {
                "speculative_algorithm": "ngram",
                "speculative_num_steps": 3,
                "speculative_num_draft_tokens": 3,
            },
            r"speculative_num_draft_tokens must be speculative_num_steps \+ 1 = 4",
        ),
        ({"speculative_algorithm": "ngram", "speculative_num_steps": 0}, "num_steps must be >= 1"),
        ({"speculative_num_steps": 2}, "need speculative_algorithm"),
        (
            {"speculative_algorithm": "ngram", "speculative_draft_model_path": "tiny"},
            "not NGRAM",
        ),
        (
            {"speculative_algorithm": "ngram", "speculative_min_accept_length": -1.0},
            "speculative_min_accept_length must be >= 0",
        ),
        (
            {"speculative_algorithm": "ngram", "speculative_max_batch_size": 0},
            "speculative_max_batch_size must be >= 1",
        ),
    ],
)
def test_bad_speculative_flags_are_refused_naming_the_flag(options, message):
    with pytest.raises(ValueError, match=message):
        ServerArgs(**options)


# ---- the NGRAM proposer ----------------------------------------------------------------------


def ngram_reference(tokens: list[int], num_draft: int, min_window: int, max_window: int):
    """Brute force: the latest position with the longest suffix match, its continuation
    repeated cyclically past the end."""
    seq_len = len(tokens)
    best_len, best_pos = 0, None
    for pos in range(seq_len - 1):
        length = 0
        while length < max_window and pos - length >= 0:
            if tokens[pos - length] != tokens[seq_len - 1 - length]:
                break
            length += 1
        if length and length >= best_len:
            best_len, best_pos = length, pos
    if best_pos is None or best_len < min_window:
        return []
    period = seq_len - (best_pos + 1)
    draft = tokens[best_pos + 1 : best_pos + 1 + num_draft]
    while len(draft) < num_draft:
        draft.append(draft[len(draft) - period])
    return draft


def test_ngram_proposals_match_the_brute_force_reference():
    rng = random.Random(0)
    for _ in range(400):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        num_draft, min_window = rng.randrange(1, 6), rng.randrange(1, 4)
        max_window = rng.randrange(min_window, 8)
        got = propose_ngram(
            np.array(tokens, dtype=np.int64),
            num_draft=num_draft,
            min_window=min_window,
            max_window=max_window,
        )
        assert got == ngram_reference(tokens, num_draft, min_window, max_window), tokens


def test_ngram_continues_the_longest_match():
    tokens = np.array([1, 2, 3, 4, 5, 9, 2, 3, 6, 1, 2, 3], dtype=np.int64)
    # "2 3" occurs twice before the end; "1 2 3" only at the start: its continuation wins.
    assert propose_ngram(tokens, num_draft=2, min_window=1, max_window=4) == [4, 5]
    assert propose_ngram(tokens, num_draft=2, min_window=4, max_window=4) == []


# ---- verification ----------------------------------------------------------------------------


def batch_info(
    batch_size: int, vocab_size: int, *, temperature: float = 0.0, top_k: int = 0
) -> SamplingBatchInfo:
    greedy = temperature == 0.0
    top_ks = top_k if top_k > 0 else vocab_size
    return SamplingBatchInfo(
        temperatures=torch.full((batch_size, 1), 1.0 if greedy else temperature),
        top_ps=torch.ones(batch_size),
        top_ks=torch.full((batch_size,), top_ks, dtype=torch.int64),
        min_ps=torch.zeros(batch_size),
        greedy=torch.full((batch_size,), greedy),
        seeds=torch.arange(batch_size, dtype=torch.int64) * 7919 + 1,
        vocab_size=vocab_size,
        all_greedy=greedy,
        need_top_k_or_p=not greedy and top_ks < vocab_size,
        need_min_p=False,
    )


def test_greedy_accepts_the_longest_prefix_agreeing_with_the_argmax():
    vocab = 12
    drafts = [[5, 6, 7], [], [1, 2]]
    argmaxes = [5, 6, 9, 0] + [4] + [1, 2, 3]  # per logits row, request by request
    logits = torch.zeros(len(argmaxes), vocab)
    logits[torch.arange(len(argmaxes)), torch.tensor(argmaxes)] = 1.0
    layout = build_verify_input(drafts, [3, 0, 8], torch.device("cpu"))
    accepted, final = verify_drafts(logits, layout, batch_info(3, vocab))
    assert accepted.tolist() == [2, 0, 2]  # the third request accepts every draft
    assert final.tolist() == [9, 4, 3]  # the target's token after the accepted drafts


@pytest.mark.parametrize(("draft_token", "top_k"), [(2, 0), (0, 0), (5, 4)])
def test_rejection_sampling_emits_the_target_distribution(draft_token, top_k):
    """Each of 6000 requests drafts the same token after the same logits: the emitted first
    token (the draft if accepted, else the residual draw) follows the filtered target p."""
    vocab, num_requests, temperature = 6, 6000, 0.8
    row_logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -1.0])
    expected = torch.softmax(row_logits / temperature, dim=-1)
    if top_k:
        expected[expected.argsort(descending=True)[top_k:]] = 0.0
        expected /= expected.sum()
    drafts = [[draft_token]] * num_requests
    logits = row_logits.repeat(2 * num_requests, 1)  # two rows per request
    layout = build_verify_input(drafts, [5] * num_requests, torch.device("cpu"))
    info = batch_info(num_requests, vocab, temperature=temperature, top_k=top_k)
    accepted, final = verify_drafts(logits, layout, info)
    first = torch.where(accepted > 0, torch.tensor(draft_token), final)
    frequencies = torch.bincount(first, minlength=vocab).double() / num_requests
    # Fixed seeds: deterministic; 0.025 is about 4 standard deviations at p = 0.5.
    assert (frequencies - expected.double()).abs().max() < 0.025, (frequencies, expected)
    if expected[draft_token] == 0:
        assert not accepted.any()  # a draft the filters exclude is never accepted


# ---- the EAGLE head's folder --------------------------------------------------------------


def test_an_eagle_head_folder_is_checked_against_the_target(tiny_model_path, tmp_path):
    from radixgen.runtime.model_config import ModelConfig
    from radixgen.runtime.models.llama_eagle import read_eagle_config
    from radixgen.runtime.tiny_model import TINY_CONFIG

    target = ModelConfig.from_folder(tiny_model_path)
    with pytest.raises(ValueError, match="speculative_draft_model_path .*LlamaForCausalLMEagle"):
        read_eagle_config(tiny_model_path, target)  # a whole model, not a head
    head = {**TINY_CONFIG, "architectures": ["LlamaForCausalLMEagle"], "num_hidden_layers": 1}
    (tmp_path / "config.json").write_text(json.dumps({**head, "hidden_size": 512}))
    with pytest.raises(ValueError, match="hidden_size is 512, the target's 256"):
        read_eagle_config(tmp_path, target)
    (tmp_path / "config.json").write_text(json.dumps({**head, "draft_vocab_size": 0}))
    with pytest.raises(ValueError, match="draft_vocab_size must be in"):
        read_eagle_config(tmp_path, target)
    (tmp_path / "config.json").write_text(json.dumps({**head, "draft_vocab_size": 64}))
    assert read_eagle_config(tmp_path, target).draft_vocab_size == 64
