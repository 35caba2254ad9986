"""The DSL on an in-process Engine (tiny model, CPU): results, streaming order, prefix
sharing measured through cached_tokens and the engine's prefill counters, select scores,
constrained gens, error handling, and the example programs."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import sys
from pathlib import Path

import jsonschema
import pydantic
import pytest

import radixgen as rg
from radixgen.prefix_trace import common_prefix, trace_prefix
from tests.structural_tag_checks import COUNTER_TAG, check_tagged_text

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
LONG_SYSTEM_PROMPT = "You are a careful assistant. " * 12  # ~70 tokens shared by a batch


@pytest.fixture(scope="module")
def engine():
    with rg.Engine(model_path="tiny", max_total_tokens=8192) as running:
        yield running


def computed_prefill_tokens(engine) -> int:
    return engine.get_stats()["num_computed_prefill_tokens"]


def num_tokens(engine, text: str) -> int:
    return len(engine.tokenizer.encode(text))


@rg.function
def qa(s, question, answer_tokens=6):
    s += rg.system("You are terse.")
    s += rg.user(question)
    s += rg.assistant(rg.gen("answer", max_tokens=answer_tokens, ignore_eos=True))


# ---- results ---------------------------------------------------------------------------


def test_program_text_messages_and_meta_match_the_engine(engine):
    state = qa.run(question="Hi?", temperature=0.0, backend=engine)
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert messages[2]["content"] == state["answer"]
    prompt = engine.apply_chat_template(messages[:2], add_generation_prompt=True)
    assert state.text() == prompt + state["answer"] + "<|im_end|>\n"
    direct = engine.generate(prompt, {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True})
    assert state["answer"] == direct["text"]
    meta = state.get_meta_info("answer")
    assert meta["prompt_tokens"] == num_tokens(engine, prompt)
    assert meta["completion_tokens"] == 6
    assert meta["finish_reason"]["type"] == "length"
    assert meta["cached_tokens"] >= 0


def test_bound_program_runs_like_the_full_call(engine):
    bound = qa.bind(answer_tokens=3)
    via_bind = bound.run(question="Hi?", temperature=0.0, backend=engine)
    direct = qa.run(question="Hi?", answer_tokens=3, temperature=0.0, backend=engine)
    assert via_bind["answer"] == direct["answer"]
    assert via_bind.get_meta_info("answer")["completion_tokens"] == 3


def test_gen_returns_output_logprobs_when_asked(engine):
    @rg.function
    def with_logprobs(s):
        s += "Hello" + rg.gen("x", max_tokens=3, ignore_eos=True, return_logprob=True)

    meta = with_logprobs.run(temperature=0.0, backend=engine).get_meta_info("x")
    logprobs = meta["output_token_logprobs"]
    assert len(logprobs) == 3 and all(lp <= 0.0 for lp, *_ in logprobs)


def test_streaming_yields_the_text_in_order(engine):
    early = qa.run(question="Now.", answer_tokens=2, stream=True, backend=engine)
    assert early["answer"]  # a read from the caller waits for the background program
    state = qa.run(question="Count.", answer_tokens=8, temperature=0.0, stream=True, backend=engine)
    answer_chunks = list(state.text_iter("answer"))
    all_chunks = list(state.text_iter())
    assert len(answer_chunks) > 1  # token deltas, not one final blob
    assert "".join(answer_chunks) == state["answer"]
    assert "".join(all_chunks) == state.text()

    async def collect() -> list[str]:
        return [chunk async for chunk in state.text_async_iter()]

    assert asyncio.run(collect()) == all_chunks
    with pytest.raises(rg.UnknownVariableError):
        list(state.text_iter("never_set"))


# ---- prefix sharing ----------------------------------------------------------------------


def test_fork_prefills_the_shared_prefix_once(engine):
    @rg.function
    def branches(s):
        s += rg.system(LONG_SYSTEM_PROMPT)
        s += rg.user_begin() + "Give three ideas." + rg.user_end()
        forks = s.fork(3)
        for index, child in enumerate(forks):
            child += rg.assistant(f"Idea {index}: " + rg.gen("idea", max_tokens=4))
        forks.join()
        s["prefill"] = forks.prefill_meta_info

    assert engine.flush_cache()
    before = computed_prefill_tokens(engine)
    state = branches.run(temperature=0.0, backend=engine)
    prefix_len = state["prefill"]["prompt_tokens"]
    assert prefix_len > 70
    assert len(state["idea"]) == 3 and all(isinstance(idea, str) for idea in state["idea"])
    for meta in state.get_meta_info("idea"):
        assert meta["cached_tokens"] >= prefix_len - 1
    # The prefix was computed once, not once per branch.
    assert computed_prefill_tokens(engine) - before < 2 * prefix_len


@rg.function
def batch_program(s, topic, fail=False):
    s += rg.system(LONG_SYSTEM_PROMPT)
    s += rg.user("Write about " + topic)
    s += rg.assistant(rg.gen("text", max_tokens=4))
    if fail:
        raise RuntimeError(f"program for {topic} failed on purpose")


def test_run_batch_warms_the_common_prefix_and_isolates_failures(engine):
    batch = [{"topic": t} for t in ("cats", "dogs", "owls", "bees")] + [
        {"topic": "eels", "fail": True}
    ]
    chat = rg.set_default_backend(engine).chat_template
    prefix = common_prefix([trace_prefix(batch_program.func, (), b, chat) for b in batch])
    prefix_len = num_tokens(engine, prefix)
    assert engine.flush_cache()
    before = computed_prefill_tokens(engine)
    states = batch_program.run_batch(batch, progress_bar=False, temperature=0.0)
    for state in states[:4]:
        assert state.error is None
        assert state.get_meta_info("text")["cached_tokens"] >= prefix_len - 1
    assert isinstance(states[4].error, RuntimeError)
    assert states[4]["text"]  # the failed program's state still holds what it produced
    assert computed_prefill_tokens(engine) - before < 2 * prefix_len + 5 * 20


# ---- select ------------------------------------------------------------------------------


@pytest.mark.parametrize("method", list(rg.ChoicesMethod))
def test_select_picks_the_argmax_of_its_scores(engine, method):
    choices = ["Paris", "London", "a very long answer", "Par"]

    @rg.function
    def pick(s):
        s += "The capital of France is "
        s += rg.select("city", choices, choices_method=method)

    state = pick.run(backend=engine)
    meta = state.get_meta_info("city")
    scores = meta["scores"]
    assert state["city"] == choices[max(range(len(choices)), key=scores.__getitem__)]
    assert state.text() == "The capital of France is " + state["city"]
    # The choice-token logprobs are the prompt logprobs of prefix + choice.
    for choice, token_ids, logprobs in zip(
        choices, meta["choice_token_ids"], meta["token_logprobs"], strict=True
    ):
        full = engine.generate(
            "The capital of France is " + choice,
            {"max_new_tokens": 0},
            return_logprob=True,
            logprob_start_len=0,
        )["meta_info"]["input_token_logprobs"]
        tail = full[-len(token_ids) :]
        assert [entry[1] for entry in tail] == token_ids
        assert [entry[0] for entry in tail] == pytest.approx(logprobs, abs=1e-3)


# ---- constrained gens ----------------------------------------------------------------------


class Pet(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=10)
    legs: int = pydantic.Field(ge=0, le=8)


def test_constrained_gens_validate(engine):
    @rg.function
    def constrained(s):
        s += "Phone: " + rg.gen("phone", regex=r"\d{3}-\d{4}")
        s += "\nPet: " + rg.gen("pet", json_schema=Pet, max_tokens=64)
        s += "\nColour: " + rg.gen("colour", choices=["red", "green", "blue"])

    state = constrained.run(temperature=0.0, backend=engine)
    assert re.fullmatch(r"\d{3}-\d{4}", state["phone"])
    jsonschema.validate(json.loads(state["pet"]), Pet.model_json_schema())
    assert state["colour"] in ("red", "green", "blue")


# ---- errors ----------------------------------------------------------------------------------


def test_unknown_variable_is_reported_with_the_known_names(engine):
    @rg.function
    def reads_typo(s):
        s += "Q: " + rg.gen("answer", max_tokens=1)
        return s["answr"]

    with pytest.raises(rg.UnknownVariableError, match=r"'answr'.*'answer'"):
        reads_typo.run(backend=engine)


def test_nested_roles_fail_before_anything_runs(engine):
    @rg.function
    def nested(s):
        s += rg.user("Hi " + rg.assistant("there"))

    with pytest.raises(rg.RoleNestingError, match="inside the open 'user'"):
        nested.run(backend=engine)

    @rg.function
    def nested_blocks(s):
        with s.user():
            with s.system():
                s += "x"

    with pytest.raises(rg.RoleNestingError):
        nested_blocks.run(backend=engine)


def test_gen_used_as_a_value_and_appending_after_the_run(engine):
    @rg.function
    def formats_gen(s):
        s += f"Answer: {rg.gen('answer')}"

    with pytest.raises(rg.ExpressionOutsideProgramError):
        formats_gen.run(backend=engine)
    state = qa.run(question="x", answer_tokens=1, backend=engine)
    with pytest.raises(rg.StateClosedError):
        state += rg.gen("more")


def test_backend_errors_surface_as_backend_error(engine):
    @rg.function
    def too_long(s):
        s += "Hi" + rg.gen("x", max_tokens=100_000)

    @rg.function
    def fork_fails_unread(s):
        s += "Hi"
        forks = s.fork(2)
        forks[1] += rg.gen("x", max_tokens=100_000)  # never read: run() still reports it

    for program in (too_long, fork_fails_unread):
        with pytest.raises(rg.BackendError, match="rejected"):
            program.run(backend=engine)


# ---- examples ------------------------------------------------------------------------------


def load_example(name: str):
    sys.path.insert(0, str(EXAMPLES))
    try:
        spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(EXAMPLES))
    return module


@pytest.mark.parametrize(
    "name,max_new_tokens",
    [
        ("quickstart", 4),
        ("multi_turn_chat", 4),
        ("json_extraction", 64),  # a complete JSON object needs room
        ("select_choices", 0),
        ("best_of_drafts", 4),
        ("react_agent", 4),
        ("batch_run", 4),
    ],
)
def test_example_runs(engine, name, max_new_tokens, capsys):
    result = load_example(name).run_example(engine, max_new_tokens)
    assert result is not None
    assert capsys.readouterr().out.strip()


def test_prefix_sharing_benchmark_computes_its_longer_prefix_once(engine):
    example = load_example("prefix_sharing_benchmark")
    prefix = example.few_shot(16)
    prefix_tokens = len(engine.tokenizer.encode(prefix))
    assert prefix_tokens > len(engine.tokenizer.encode(example.few_shot(8))) + 100

    def fork_four():
        example.branches.run(
            prefix=prefix, num_branches=4, max_tokens=2, backend=engine, temperature=0.0
        )

    computed, _, seconds = example.measure(engine, fork_four)
    # Four branches, one prefill of the prefix (plus each branch's few own tokens).
    assert prefix_tokens <= computed < prefix_tokens + 40 and seconds > 0


def test_code_examples_make_sense_on_the_trained_model(engine, capsys):
    facts = load_example("json_extraction").run_example(engine, 64)
    assert [f["function"] for f in facts] == ["read_config", "send_email"]
    selections = load_example("select_choices").run_example(engine, 0)
    for states in selections.values():  # every scoring method picks the idiomatic choice
        assert [s["by_score"] for s in states] == ["print(i)", "ValueError:", '"__main__":']
    drafts = load_example("best_of_drafts").run_example(engine, 16)
    assert drafts["mean_logprobs"][drafts["best"]] == max(drafts["mean_logprobs"])
    assert min(drafts["cached_tokens"]) > 0  # the stub was prefilled once, then shared


def test_json_extraction_with_too_few_tokens_says_so(engine):
    # Below the shortest valid JSON the engine refuses the request, naming the minimum.
    with pytest.raises(rg.BackendError, match=r"max_new_tokens too small.*needs \d+ tokens"):
        load_example("json_extraction").run_example(engine, 4)


def test_react_agent_calls_a_tool_with_a_valid_input(engine, capsys):
    agent = load_example("react_agent")
    state = agent.run_example(engine, 4)
    assert state["action_0"] in agent.TOOLS
    assert re.fullmatch(agent.TOOL_INPUT_REGEX, state["input_0"])
    observation = agent.TOOLS[state["action_0"]](state["input_0"])
    assert f"Observation: {observation}\n" in state.text()
    assert agent.calculator("12 * 7") == "84"


def test_structural_tag_bodies_validate_through_the_engine_and_the_dsl(engine):
    samples = engine.generate(
        "def main():", {"max_new_tokens": 40, "temperature": 1.0, "seed": 11, "n": 4,
                        "structural_tag": COUNTER_TAG},
    )  # fmt: skip
    bodies = []
    for sample in samples:
        by_length = sample["meta_info"]["finish_reason"]["type"] == "length"
        bodies += check_tagged_text(sample["text"], COUNTER_TAG, finished_by_length=by_length)
    assert bodies, [sample["text"] for sample in samples]  # tags did open, and validated

    @rg.function
    def tagged(s):
        s += "Log: "
        s += rg.gen("log", structural_tag=COUNTER_TAG, max_tokens=24)

    state = tagged.run(backend=engine, temperature=1.0, seed=3)
    check_tagged_text(state["log"], COUNTER_TAG, finished_by_length=True)
    with pytest.raises(ValueError, match="structural_tag"):
        rg.gen("bad", structural_tag={"structures": [], "triggers": ["e"]})


def test_gen_takes_ebnf_and_lark_grammars(engine):
    @rg.function
    def answer(s):
        s += "Is it sorted? "
        s += rg.gen("verdict", ebnf='root ::= ("yes" | "no") " because " [a-z]+', max_tokens=12)
        s += "\nCode: "
        s += rg.gen("code", lark='start: "x" /[0-9]{3}/', max_tokens=8)

    state = answer.run(backend=engine, temperature=0)
    assert re.fullmatch("(yes|no) because [a-z]+", state["verdict"]), state["verdict"]
    assert re.fullmatch("x[0-9]{3}", state["code"])
    with pytest.raises(ValueError, match="at most one"):
        rg.gen("both", ebnf="root ::= 'a'", regex="a")


WEATHER_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"], "additionalProperties": False}}},
]  # fmt: skip


def test_gen_with_tools_returns_a_parsed_call_that_validates(engine):
    @rg.function
    def call(s):
        s += rg.user("What is the weather in Paris?")
        s += rg.assistant(rg.gen("call", tools=WEATHER_TOOLS, max_tokens=48))

    state = call.run(backend=engine, temperature=1.0, seed=1)
    parsed = state["call"]
    functions = {tool["function"]["name"]: tool["function"] for tool in WEATHER_TOOLS}
    assert set(parsed) == {"name", "arguments"} and parsed["name"] in functions
    jsonschema.validate(parsed["arguments"], functions[parsed["name"]]["parameters"])
    assert json.dumps(parsed, separators=(",", ":")) in state.text()  # the JSON was appended
    with pytest.raises(ValueError, match="tools"):
        rg.gen("bad", tools=WEATHER_TOOLS, regex="a")
    with pytest.raises(ValueError, match=r"tools\[0\].function.name"):
        rg.gen("bad", tools=[{"type": "function", "function": {"name": "no spaces"}}])
