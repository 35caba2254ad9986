"""Speculative decoding (NGRAM, STANDALONE, EAGLE) through the Engine and the server, on the
trained tiny model and its trained drafts (CPU, fp32): greedy outputs identical to plain
decoding (radix cache on; off with a pool small enough to retract), seeded sampling keeping
the target distribution, constrained, penalised and logprob requests replayed token for token,
the accept length reported, and the KV pools whole afterwards."""

from __future__ import annotations

import json
import re

import httpx
import numpy as np
import openai
import pytest

import radixgen as rg
from radixgen.runtime.engine import Engine
from radixgen.runtime.server.subprocess_launcher import ServerProcess
from radixgen.runtime.tiny_assets.corpus import CI_SLICE_PATH
from radixgen.runtime.tiny_model import TINY_CONFIG, write_random_model
from tests.server_checks import assert_healthy_and_whole

SNIPPETS = [
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n",
    "import os\nimport sys\nimport re\nimport json\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n",
    "for i in range(10):\n    print(i)\nfor j in range(10):\n",
]
NUM_HELDOUT = 4
HELDOUT_PROMPT_LEN = 48
# Backing off never (min accept length 0): these tests want every step to speculate.
SPECULATIVE = {
    "speculative_algorithm": "ngram",
    "speculative_max_batch_size": 16,
    "speculative_min_accept_length": 0,
}
# Greedy with every way to finish: length (at and near the draft length), EOS, stop strings,
# stop ids; one sampled row rides along (its tokens may differ, its presence may not matter).
SAMPLING = [
    {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True},
    {"temperature": 0, "max_new_tokens": 3, "ignore_eos": True},
    {"temperature": 0, "max_new_tokens": 32, "stop": ["\n\n"]},
    {"temperature": 0, "max_new_tokens": 32, "stop_token_ids": [10]},
    {"temperature": 0, "max_new_tokens": 36},
    {"temperature": 0, "max_new_tokens": 5, "ignore_eos": True},
    {"temperature": 0.8, "max_new_tokens": 20, "seed": 3, "ignore_eos": True},
    {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True, "min_new_tokens": 6},
]
GREEDY_ROWS = [i for i, params in enumerate(SAMPLING) if params["temperature"] == 0]
# tiny's trained EAGLE head (runtime/tiny_assets/eagle_head.safetensors, built as a folder).
EAGLE = {
    "speculative_algorithm": "EAGLE",
    "speculative_draft_model_path": "tiny-eagle",
    "speculative_num_steps": 3,
    "speculative_max_batch_size": 16,
}


def prompts(tokenizer) -> list[list[int]]:
    """Repetitive code snippets and windows of tiny's held-out test split."""
    heldout = np.load(CI_SLICE_PATH)  # [windows, 1024] uint16
    windows = [
        heldout[i % len(heldout), 100 * i : 100 * i + HELDOUT_PROMPT_LEN].tolist()
        for i in range(NUM_HELDOUT)
    ]
    return [tokenizer.encode(text) for text in SNIPPETS] + windows


def run(engine: Engine) -> list[list[int]]:
    outputs = engine.generate(input_ids=prompts(engine.tokenizer), sampling_params=SAMPLING)
    engine.check_integrity()
    return [output["output_ids"] for output in outputs]


@pytest.fixture(scope="module")
def plain_outputs(tiny_model_path) -> list[list[int]]:
    with Engine(model_path=tiny_model_path, dtype="float32", skip_warmup=True) as engine:
        return run(engine)


@pytest.mark.parametrize(
    "options",
    [
        {},
        # No cache, and a pool this small retracts requests mid-generation.
        {
            "disable_radix_cache": True,
            "max_total_tokens": 300,
            "chunked_prefill_size": 64,
            "new_token_ratio": 0.05,
        },
    ],
    ids=["radix-cache", "retracting"],
)
def test_greedy_outputs_are_identical_with_ngram_speculation(
    tiny_model_path, plain_outputs, options
):
    with Engine(
        model_path=tiny_model_path, dtype="float32", skip_warmup=True, **SPECULATIVE, **options
    ) as engine:
        outputs = run(engine)
        stats = engine.get_stats()
    for row in GREEDY_ROWS:
        assert outputs[row] == plain_outputs[row], row
    assert stats["num_spec_verify_steps"] > 0
    assert stats["num_spec_accepted_tokens"] > 0
    assert stats["spec_accept_length"] > 1.3  # tokens per request per verify step
    assert stats["num_forward_steps"] < 40 + len(SAMPLING)  # fewer forwards than tokens
    if "max_total_tokens" in options:
        assert stats["num_retractions"] > 0


def test_verify_as_decode_rows_keeps_greedy_outputs(tiny_model_path, plain_outputs):
    """The verify forward as one DECODE row per token (each request's rows share its
    req_to_token row; on a GPU this replays the decode CUDA graphs) is the same causal
    attention: greedy outputs are plain decoding's. Forced here: the CPU has no graphs."""
    with Engine(
        model_path=tiny_model_path, dtype="float32", skip_warmup=True, **SPECULATIVE
    ) as engine:
        engine._scheduler.speculative.verify_as_decode_rows = True  # no public switch
        outputs = run(engine)
        stats = engine.get_stats()
    for row in GREEDY_ROWS:
        assert outputs[row] == plain_outputs[row], row
    assert stats["spec_accept_length"] > 1.3


@pytest.fixture(scope="module")
def random_draft_path(tmp_path_factory) -> str:
    """A one-layer draft with random weights and tiny's tokenizer: mostly wrong drafts."""
    folder = tmp_path_factory.mktemp("random-draft")
    write_random_model(folder, {**TINY_CONFIG, "num_hidden_layers": 1}, seed=1)
    return str(folder)


@pytest.mark.parametrize("draft", ["tiny-itself", "random-one-layer", "tiny-draft"])
def test_greedy_outputs_are_identical_with_a_standalone_draft_model(
    tiny_model_path, plain_outputs, random_draft_path, draft
):
    """STANDALONE: the target as its own draft accepts every draft; a random draft almost
    none, so speculation backs off (the default minimum accept length); tiny's trained
    one-layer draft accepts some; all leave greedy outputs unchanged and both KV pools whole
    (retracting too)."""
    draft_path = {"tiny-itself": tiny_model_path, "random-one-layer": random_draft_path}.get(
        draft, draft
    )
    options = {
        "speculative_algorithm": "STANDALONE",
        "speculative_draft_model_path": draft_path,
        "speculative_num_steps": 3,
        "speculative_max_batch_size": 16,
    }
    if draft != "random-one-layer":
        options["speculative_min_accept_length"] = 0
    else:
        options |= {"max_total_tokens": 270, "new_token_ratio": 0.05, "chunked_prefill_size": 64}
    with Engine(model_path=tiny_model_path, dtype="float32", skip_warmup=True, **options) as e:
        outputs = run(e)  # checks both pools: the draft's is whole once idle
        stats = e.get_stats()
    for row in GREEDY_ROWS:
        assert outputs[row] == plain_outputs[row], row
    assert stats["num_spec_draft_tokens"] > 0
    if draft == "tiny-itself":
        # Greedy rows accept all; the one sampled row may reject.
        assert stats["num_spec_accepted_tokens"] > 0.8 * stats["num_spec_draft_tokens"]
        assert stats["spec_accept_length"] > 3.0
    elif draft == "tiny-draft":
        assert stats["spec_accept_length"] > 1.3
    else:
        assert stats["num_retractions"] > 0
        # Probes after 1, 2, 4, 8, ... plain steps: a handful of verify steps, not one a step.
        assert 0 < stats["num_spec_verify_steps"] <= 8 < stats["num_forward_steps"] // 4


@pytest.mark.parametrize(
    "options",
    [
        {"speculative_min_accept_length": 0},
        # Backing off (plain steps in between) and retracting: the head's memory starts over.
        {
            "speculative_min_accept_length": 2.5,
            "disable_radix_cache": True,
            "max_total_tokens": 270,
            "chunked_prefill_size": 64,
            "new_token_ratio": 0.05,
        },
    ],
    ids=["every-step", "backing-off-and-retracting"],
)
def test_greedy_outputs_are_identical_with_eagle(tiny_model_path, plain_outputs, options):
    """EAGLE: tiny's trained head drafts on tiny's hidden states; greedy outputs are plain
    decoding's, the head's own KV pool is whole when idle (`run` checks), and drafts are
    accepted."""
    with Engine(
        model_path=tiny_model_path, dtype="float32", skip_warmup=True, **EAGLE, **options
    ) as engine:
        outputs = run(engine)
        stats = engine.get_stats()
    for row in GREEDY_ROWS:
        assert outputs[row] == plain_outputs[row], row
    assert stats["num_spec_accepted_tokens"] > 0
    if "max_total_tokens" in options:
        assert stats["num_retractions"] > 0
    else:
        assert stats["spec_accept_length"] > 1.3


USERS_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "id": {"type": "integer"}},
        "required": ["name", "id"],
        "additionalProperties": False,
    },
    "minItems": 4,
    "maxItems": 6,
}
LOOP_REGEX = r"(for [a-z] in range\([0-9]\):\n    print\([a-z]\)\n){2,4}"


def test_constrained_penalised_and_logprob_requests_replay_exactly(tiny_model_path):
    """Requests with a JSON schema, a regex, a repetition penalty, a min-token ban and
    logprobs verify by replaying the plain sampler over the verify rows: their outputs,
    sampled ones included, are token for token those of plain decoding."""
    prompts = ["Users as JSON:\n", SNIPPETS[0], SNIPPETS[1], SNIPPETS[3]]
    params = [
        {"temperature": 0, "max_new_tokens": 80, "json_schema": json.dumps(USERS_SCHEMA)},
        # Not seed 5: it draws u within ~1e-7 of 1 at step 13, among tail tokens whose order
        # fp32 rounding flips even between two plain runs (batch composition differs).
        {"temperature": 0.7, "seed": 6, "max_new_tokens": 30, "repetition_penalty": 1.1},
        {"temperature": 0, "max_new_tokens": 30, "ignore_eos": True, "min_new_tokens": 20},
        {"temperature": 0.8, "seed": 9, "max_new_tokens": 30, "regex": LOOP_REGEX},
    ]
    results = []
    for options in ({}, SPECULATIVE):
        with Engine(model_path=tiny_model_path, dtype="float32", skip_warmup=True, **options) as e:
            outputs = e.generate(prompts, params, return_logprob=True, top_logprobs_num=2)
            e.check_integrity()
            stats = e.get_stats()
        results.append(outputs)
    assert stats["num_spec_accepted_tokens"] > 20
    for plain, speculated in zip(*results, strict=True):
        assert speculated["output_ids"] == plain["output_ids"]
        logprobs = [
            [entry[0] for entry in out["meta_info"]["output_token_logprobs"]]
            for out in (plain, speculated)
        ]
        assert np.allclose(*logprobs, atol=1e-4)  # extend and decode forwards: fp32 rounding
    json.loads(results[1][0]["text"])
    assert re.fullmatch(LOOP_REGEX, results[1][3]["text"])


@pytest.mark.parametrize("speculative", [SPECULATIVE, EAGLE], ids=["ngram", "eagle"])
def test_dsl_program_on_a_speculative_engine(tiny_model_path, speculative):
    """The DSL runs unchanged on an Engine with NGRAM or EAGLE: a fork of code completions, one
    of them regex-constrained, gives the plain engine's text."""

    @rg.function
    def complete(s, snippets):
        forks = s.fork(len(snippets))
        for fork, snippet in zip(forks, snippets, strict=True):
            fork += snippet + rg.gen("code", max_tokens=24, temperature=0.0, ignore_eos=True)
        s += "loop:" + rg.gen("loop", max_tokens=30, temperature=0.0, regex=LOOP_REGEX)
        s["codes"] = [fork["code"] for fork in forks]

    texts = []
    for options in ({}, speculative):
        with rg.Engine(model_path=tiny_model_path, skip_warmup=True, **options) as engine:
            state = complete.run(snippets=SNIPPETS[:3], backend=engine)
            texts.append((state["codes"], state["loop"]))
            stats = engine.get_stats()
    assert texts[0] == texts[1]
    assert stats["num_spec_verify_steps"] > 0


def test_sampling_keeps_the_target_distribution_on_tiny(tiny_model_path):
    """400 seeded samples of 4 tokens after a repetitive prompt (drafts from the first decode
    step on), with and without speculation: every token's frequency at every position agrees
    within 5 standard errors of a difference of two frequencies (fixed seeds: deterministic).
    This checks the wiring end to end (rows, seeds, temperature, finishing) with a small
    budget; the exact law of acceptance and resampling is tested on hand-made logits with
    known probabilities (test_speculative_units.py)."""
    num_samples, num_new = 400, 4
    prompt = SNIPPETS[3] + "    print(j)\nfor k in range(10):\n"
    params = [
        {"temperature": 0.7, "max_new_tokens": num_new, "ignore_eos": True, "seed": seed}
        for seed in range(num_samples)
    ]
    options = {"max_total_tokens": 8192, "max_running_requests": num_samples}
    tokens = []
    for speculative in ({}, {**SPECULATIVE, "speculative_max_batch_size": num_samples}):
        with Engine(
            model_path=tiny_model_path, dtype="float32", skip_warmup=True, **options, **speculative
        ) as engine:
            outputs = engine.generate([prompt] * num_samples, params)
            engine.check_integrity()
            if speculative:
                assert engine.get_stats()["num_spec_accepted_tokens"] > num_samples // 8
        tokens.append(np.array([o["output_ids"] for o in outputs]))  # [samples, num_new]
    plain, speculated = tokens
    assert not np.array_equal(plain, speculated)  # the draws differ, not their law
    for position in range(num_new):
        for token in np.unique(np.concatenate([plain[:, position], speculated[:, position]])):
            p = (plain[:, position] == token).mean()
            q = (speculated[:, position] == token).mean()
            pooled = (p + q) / 2
            standard_error = np.sqrt(2 * pooled * (1 - pooled) / num_samples)
            assert abs(p - q) <= 5 * standard_error + 1e-9, (position, token, p, q)


def test_server_with_ngram_speculation_matches_plain_greedy(tiny_model_path, plain_outputs):
    flags = ["--log-level", "warning", "--speculative-algorithm", "NGRAM"]
    flags += ["--speculative-num-draft-tokens", "5", "--speculative-max-batch-size", "16"]
    flags += ["--speculative-min-accept-length", "0"]
    with ServerProcess(flags) as server, httpx.Client(base_url=server.base_url, timeout=60) as http:
        tokenizer_prompts = prompts(_tokenizer(tiny_model_path))
        rows = GREEDY_ROWS
        response = http.post(
            "/generate",
            json={
                "input_ids": [tokenizer_prompts[row] for row in rows],
                "sampling_params": [SAMPLING[row] for row in rows],
            },
        )
        assert response.status_code == 200, response.text
        assert [out["output_ids"] for out in response.json()] == [plain_outputs[r] for r in rows]
        # The OpenAI client, token-id prompt, streamed: the same text as plain decoding.
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)
        stream = client.completions.create(
            model="tiny",
            prompt=tokenizer_prompts[0],
            max_tokens=SAMPLING[0]["max_new_tokens"],
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        streamed = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
        assert streamed == _tokenizer(tiny_model_path).decode(plain_outputs[0])
        scheduler = http.get("/get_server_info").json()["scheduler"]
        assert scheduler["spec_accept_length"] > 1.3
        metrics = http.get("/metrics").text
        assert re.search(r"^radixgen:spec_accept_length\{[^}]*\} (1\.[3-9]|[2-9])", metrics, re.M)
        assert_healthy_and_whole(http)


@pytest.mark.slow  # a second server: ~35 s on 2 shared cores
def test_server_with_eagle_matches_plain_greedy(tiny_model_path, plain_outputs):
    """`--speculative-algorithm eagle` with tiny's head folder: a batch of greedy requests gets
    plain decoding's tokens, and the server is healthy and its pools whole afterwards."""
    flags = ["--log-level", "warning", "--speculative-algorithm", "eagle"]
    flags += ["--speculative-draft-model-path", "tiny-eagle", "--speculative-num-steps", "3"]
    flags += ["--speculative-min-accept-length", "0"]
    with ServerProcess(flags) as server, httpx.Client(base_url=server.base_url, timeout=60) as http:
        tokenizer_prompts = prompts(_tokenizer(tiny_model_path))
        response = http.post(
            "/generate",
            json={
                "input_ids": [tokenizer_prompts[row] for row in GREEDY_ROWS],
                "sampling_params": [SAMPLING[row] for row in GREEDY_ROWS],
            },
        )
        assert response.status_code == 200, response.text
        outputs = [out["output_ids"] for out in response.json()]
        assert outputs == [plain_outputs[row] for row in GREEDY_ROWS]
        scheduler = http.get("/get_server_info").json()["scheduler"]
        assert scheduler["num_spec_accepted_tokens"] > 0
        assert_healthy_and_whole(http)


def _tokenizer(model_path: str):
    from radixgen.runtime.tokenizer import load_tokenizer

    return load_tokenizer(model_path, None)


@pytest.mark.gpu
def test_gpu_greedy_outputs_are_identical_with_ngram_speculation(tiny_model_path):
    """On CUDA (Triton attention, CUDA-graph decode, overlap on; verify forwards run as decode
    rows through the decode CUDA graphs, docs/engine.md): fp32 greedy outputs with NGRAM equal
    plain decoding's, and the pool is whole."""
    results = []
    for options in ({}, SPECULATIVE):
        with Engine(model_path=tiny_model_path, device="cuda", dtype="float32", **options) as e:
            results.append(run(e))
            stats = e.get_stats()
    for row in GREEDY_ROWS:
        assert results[1][row] == results[0][row], row
    assert stats["spec_accept_length"] > 1.3


@pytest.mark.gpu
def test_gpu_eagle_keeps_greedy_outputs(tiny_model_path):
    """On CUDA (Triton attention for the target and the head; verify forwards as decode rows
    replayed from the decode CUDA graphs, which keep the hidden states for EAGLE): fp32 greedy
    outputs with tiny's EAGLE head equal plain decoding's, and drafts are accepted."""
    results = []
    for options in ({}, {**EAGLE, "speculative_min_accept_length": 0}):
        with Engine(model_path=tiny_model_path, device="cuda", dtype="float32", **options) as e:
            graphs = e._scheduler.runner.cuda_graph_runner
            assert graphs.keeps_hidden_states == bool(options)
            if options:  # a small batch's verify rows take the graphs
                assert e._scheduler.speculative._verifies_as_decode_rows(8, 512)
            results.append(run(e))
            stats = e.get_stats()
    for row in GREEDY_ROWS:
        assert results[1][row] == results[0][row], row
    assert stats["spec_accept_length"] > 1.3


@pytest.mark.gpu
def test_gpu_standalone_draft_keeps_greedy_outputs(tiny_model_path):
    """On CUDA the draft model gets its own runner (and decode CUDA graphs): tiny as its own
    draft accepts its drafts and changes no greedy output."""
    options = {
        "speculative_algorithm": "STANDALONE",
        "speculative_draft_model_path": tiny_model_path,
        "speculative_max_batch_size": 16,
        "mem_fraction_static": 0.4,  # the draft's weights and KV come after the target's
    }
    results = []
    for speculative in ({}, options):
        with Engine(model_path=tiny_model_path, device="cuda", dtype="float32", **speculative) as e:
            results.append(run(e))
            stats = e.get_stats()
    for row in GREEDY_ROWS:
        assert results[1][row] == results[0][row], row
    assert stats["spec_accept_length"] > 2.0
