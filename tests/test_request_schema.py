"""The one request schema and its one validation function (runtime/request_schema.py)."""

from __future__ import annotations

import json

import pytest

from radixgen.runtime.request_schema import (
    MAX_JSON_DEPTH,
    MAX_N,
    MAX_PROMPTS_PER_REQUEST,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    MAX_TOP_LOGPROBS,
    GenerateReq,
    ModelLimits,
    RequestFieldError,
    SamplingParams,
    build_request,
    check_num_prompts,
    json_depth,
    validate_request,
)

LIMITS = ModelLimits(vocab_size=100, context_length=64, kv_capacity=1000)
STRUCTURE = {"begin": "<a>", "schema": {"type": "integer"}, "end": "</a>"}
TAG = {"type": "structural_tag", "structures": [STRUCTURE], "triggers": ["<a>"]}


def refused(field_name: str, match: str, **options) -> None:
    with pytest.raises(RequestFieldError, match=match) as caught:
        build_request(options, text="hi")
    assert caught.value.field == field_name


@pytest.mark.parametrize(
    ("options", "field_name", "match"),
    [
        # Seeds are int64 on the device and sample i uses seed + i.
        ({"seed": 2**63}, "seed", r"seed must be in \[0, 9223372036854775807\]"),
        ({"seed": 2**70}, "seed", "seed must be in"),
        ({"seed": -1}, "seed", "seed must be in"),
        ({"seed": 2**63 - 2, "n": 3}, "seed", r"seed \+ n - 1 must be < 2\*\*63"),
        ({"seed": True}, "seed", "seed must be an int, got True"),
        ({"n": True}, "n", "n must be an int"),
        # Numbers are finite (JSON's Infinity and 1e309 both parse to inf).
        ({"temperature": float("inf")}, "temperature", "temperature must be a finite number"),
        ({"temperature": float("nan")}, "temperature", "temperature must be a finite number"),
        ({"top_p": float("inf")}, "top_p", "finite"),
        ({"min_p": float("-inf")}, "min_p", "finite"),
        ({"frequency_penalty": float("inf")}, "frequency_penalty", "finite"),
        ({"temperature": False}, "temperature", "temperature must be a number"),
        # top_p = 0 is refused everywhere, with the greedy hint.
        ({"top_p": 0.0}, "top_p", r"top_p must be > 0 \(use temperature=0 for greedy\)"),
        ({"top_p": 1.5}, "top_p", r"top_p must be in \(0, 1.0\]"),
        # Caps on size-like fields name the accepted range.
        ({"n": MAX_N + 1}, "n", rf"n must be in \[1, {MAX_N}\], got {MAX_N + 1}"),
        ({"n": 10**7}, "n", rf"n must be in \[1, {MAX_N}\]"),
        ({"top_logprobs_num": 33}, "top_logprobs_num", rf"\[0, {MAX_TOP_LOGPROBS}\]"),
        ({"stop": ["x"] * (MAX_STOP_STRINGS + 1)}, "stop", f"at most {MAX_STOP_STRINGS}"),
        ({"stop": "x" * (MAX_STOP_STRING_CHARS + 1)}, "stop", f"{MAX_STOP_STRING_CHARS} chars"),
        ({"stop_token_ids": [1] * 2000}, "stop_token_ids", "at most 1024"),
        ({"stop_token_ids": [False]}, "stop_token_ids", "list of ints"),
        # Bools are bools.
        ({"stream": "yes"}, "stream", "stream must be a bool"),
        ({"return_logprob": 1}, "return_logprob", "return_logprob must be a bool"),
        ({"ignore_eos": "true"}, "ignore_eos", "ignore_eos must be a bool"),
        ({"regex": "a", "choices": ["a"]}, "choices", "at most one of regex"),
        ({"choices": 1}, "choices", "choices must be a list of strings"),
        ({"constraint_budget": "no"}, "constraint_budget", "constraint_budget must be a bool"),
        ({"tempreature": 0.5}, "tempreature", "unknown sampling parameter"),
        # structural_tag: the shape, part by part (the grammar's own checks come at compile).
        ({"structural_tag": TAG, "regex": "a"}, "structural_tag", "at most one of regex"),
        ({"structural_tag": "{not json"}, "structural_tag", "structural_tag is not valid JSON"),
        ({"structural_tag": [TAG]}, "structural_tag", "structural_tag must be a JSON object"),
        ({"structural_tag": {**TAG, "tags": []}}, "structural_tag", r"unknown: \['tags'\]"),
        ({"structural_tag": {**TAG, "type": "json"}}, "structural_tag", "type must be 'structural_tag'"),
        ({"structural_tag": {**TAG, "structures": []}}, "structural_tag", "structural_tag.structures must be a list of 1 to 64"),
        ({"structural_tag": {**TAG, "triggers": [""]}}, "structural_tag", r"triggers\[0\] must be a non-empty string"),
        ({"structural_tag": {**TAG, "structures": [{"begin": "<a>", "end": "</a>"}]}}, "structural_tag", r"structures\[0\] takes .* missing: \['schema'\]"),
        ({"structural_tag": {**TAG, "structures": [{**STRUCTURE, "begin": 1}]}}, "structural_tag", r"structures\[0\].begin must be a non-empty string"),
        ({"structural_tag": {**TAG, "structures": [{**STRUCTURE, "schema": "x"}]}}, "structural_tag", r"structures\[0\].schema must be a JSON schema object"),
    ],
)  # fmt: skip
def test_bad_fields_are_refused_naming_field_and_range(options, field_name, match):
    refused(field_name, match, **options)


def test_field_errors_are_both_value_and_type_errors():
    # Callers of either convention (ValueError for values, TypeError for types) catch them.
    with pytest.raises(ValueError):
        SamplingParams.from_dict({"n": 0})
    with pytest.raises(TypeError):
        SamplingParams.from_dict({"stop": 3})


def test_the_largest_seed_that_fits_is_accepted():
    request = build_request({"seed": 2**63 - 3, "n": 3, "temperature": 1.0}, text="hi")
    assert request.sampling_params.seed + request.sampling_params.n - 1 == 2**63 - 1


def test_tokenized_bounds_need_the_model_limits():
    request = GenerateReq(input_ids=[1, 2, 3], sampling_params=SamplingParams(max_new_tokens=8))
    validate_request(request, LIMITS)
    for ids, match in [
        ([False], r"input_ids must be ints in \[0, 100\)"),  # JSON false is not token 0
        ([100], r"input_ids must be ints in \[0, 100\)"),
        ([], "the prompt is empty"),
        ([1] * 64, "context length"),
    ]:
        with pytest.raises(RequestFieldError, match=match):
            validate_request(GenerateReq(input_ids=ids), LIMITS)
    too_long = GenerateReq(input_ids=[1] * 60, sampling_params=SamplingParams(max_new_tokens=8))
    with pytest.raises(RequestFieldError, match="max_new_tokens"):
        validate_request(too_long, LIMITS)
    start = GenerateReq(
        input_ids=[1, 2], sampling_params=SamplingParams(max_new_tokens=1), logprob_start_len=3
    )
    with pytest.raises(RequestFieldError, match=r"logprob_start_len must be an int in \[0, 2\]"):
        validate_request(start, LIMITS)
    stop_ids = GenerateReq(
        input_ids=[1], sampling_params=SamplingParams(max_new_tokens=1, stop_token_ids=[100])
    )
    with pytest.raises(RequestFieldError, match=r"stop_token_ids must be \[0, 100\)"):
        validate_request(stop_ids, LIMITS)


def test_validation_normalises_once_for_every_front_end():
    request = build_request(
        {"stop": "\n", "json_schema": {"b": 1, "a": 2}, "logprob_start_len": -1}, text="hi"
    )
    assert request.sampling_params.stop == ["\n"]
    # One JSON string form for the DSL, the Engine and the server; the declared key order
    # is kept (it is the order of the output's keys).
    assert request.sampling_params.json_schema == json.dumps({"b": 1, "a": 2})
    assert request.logprob_start_len is None  # SGLang's -1: output logprobs only
    assert SamplingParams.from_dict({"json_schema": '{"b": 1, "a": 2}'}).json_schema == (
        request.sampling_params.json_schema
    )


def test_number_of_prompts_is_capped_before_tokenizing():
    check_num_prompts(MAX_PROMPTS_PER_REQUEST)
    for count in (0, MAX_PROMPTS_PER_REQUEST + 1):
        with pytest.raises(RequestFieldError, match=f"1 to {MAX_PROMPTS_PER_REQUEST} prompts"):
            check_num_prompts(count)


def test_structural_tag_is_normalised_to_canonical_json():
    from_dict = build_request({"structural_tag": TAG}, text="hi").sampling_params.structural_tag
    from_text = build_request({"structural_tag": json.dumps(TAG)}, text="hi")
    assert from_dict == from_text.sampling_params.structural_tag
    assert json.loads(from_dict) == {"structures": [STRUCTURE], "triggers": ["<a>"]}


def test_json_depth_counts_arrays_and_objects_however_mixed():
    ids = list(range(2176))  # a prompt's token ids: one level
    assert [json_depth(value) for value in (7, "s", None, [], {}, ids)] == [0, 0, 0, 1, 1, 1]
    assert json_depth({"input_ids": ids, "sampling_params": {"stop": ["a", "b"]}}) == 3
    # A container after many scalars, or among them, is still walked.
    assert json_depth([*ids, [[1]]]) == 3
    assert json_depth({"a": 1, "b": [{"c": [True, None, 1.5, {"d": []}]}]}) == 6
    deep = []
    for _ in range(MAX_JSON_DEPTH + 5):
        deep = [1, deep, "x"]
    assert json_depth(deep) > MAX_JSON_DEPTH  # stops walking past the limit
