"""The DSL without a model: expressions, argument checks, chat-template derivation, the
prefix tracer, the text stream, and the errors that need no generation."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading

import pydantic
import pytest

import radixgen as rg
from radixgen.backends.choice_scoring import select_by_prompt_logprobs
from radixgen.backends.generate_payload import request_options
from radixgen.chat_template import derive_chat_template, jinja_renderer
from radixgen.context import BackendContext
from radixgen.ir import ChoicesMethod, Gen, RoleBegin, RoleEnd, Select, Text, flatten
from radixgen.prefix_trace import common_prefix, trace_prefix
from radixgen.runtime.request_schema import build_request
from radixgen.runtime.tiny_model import CHAT_TEMPLATE
from radixgen.text_stream import TextStream
from radixgen.transcript import Transcript

# A Llama-3-like template: a BOS text and a default header, to exercise BOS stripping.
LLAMA_LIKE_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# A template without a system role (it raises), like Gemma's.
NO_SYSTEM_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "<turn>{{ m['role'] }}\n{{ m['content'] }}</turn>\n{% endfor %}"
)


class Answer(pydantic.BaseModel):
    name: str
    age: int


# ---- expressions -------------------------------------------------------------------------


def test_expressions_concatenate_and_flatten_in_order():
    expr = "Q: " + rg.gen("a", max_tokens=3) + "\n" + rg.user("hi " + rg.select("c", ["x", "y"]))
    steps = flatten(expr)
    assert [type(step) for step in steps] == [Text, Gen, Text, RoleBegin, Text, Select, RoleEnd]
    assert steps[0] == Text("Q: ") and steps[4] == Text("hi ")
    assert steps[1].options == {"max_new_tokens": 3}


def test_expression_used_as_a_value_is_a_clear_error():
    gen = rg.gen("answer")
    with pytest.raises(rg.ExpressionOutsideProgramError, match="append it to a program state"):
        str(gen)
    with pytest.raises(rg.ExpressionOutsideProgramError):
        f"{gen}"  # noqa: B018 - the f-string itself is what must fail
    with pytest.raises(rg.ExpressionOutsideProgramError):
        bool(rg.select("x", ["a"]))
    assert "rg.gen('answer')" in repr(gen)


def test_gen_arguments_are_checked_by_name():
    with pytest.raises(ValueError, match="temperature"):
        rg.gen("x", temperature=-1)
    with pytest.raises(TypeError, match="max_tokens"):
        rg.gen("x", max_tokens=2.5)
    with pytest.raises(ValueError, match=r"min_new_tokens \(rg.gen's min_tokens\) must be >= 0"):
        rg.gen("x", min_tokens=-1)
    with pytest.raises(ValueError, match=r"temperature must be >= 0.0, got -1"):
        rg.gen("x", temperature=-1)
    with pytest.raises(ValueError, match="at most one of regex, json_schema, choices"):
        rg.gen("x", regex="a+", choices=["a"])
    with pytest.raises(ValueError, match="json_schema is not valid JSON"):
        rg.gen("x", json_schema="{not json")
    with pytest.raises(TypeError, match="stop"):
        rg.gen("x", stop=3)
    with pytest.raises(TypeError, match="name"):
        rg.gen(3)


def test_json_schema_accepts_pydantic_dict_and_string():
    from_model = json.loads(rg.gen("x", json_schema=Answer).options["json_schema"])
    assert from_model["properties"]["age"]["type"] == "integer"
    as_dict = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert json.loads(rg.gen("x", json_schema=as_dict).options["json_schema"]) == as_dict
    assert (
        json.loads(rg.gen("x", json_schema=json.dumps(as_dict)).options["json_schema"]) == as_dict
    )


def test_select_rejects_empty_and_bad_choices():
    with pytest.raises(ValueError, match="at least one choice"):
        rg.select("x", [])
    with pytest.raises(TypeError, match="list of strings"):
        rg.select("x", "abc")
    with pytest.raises(ValueError, match="choices_method"):
        rg.select("x", ["a"], choices_method="best_guess")
    assert rg.select("x", ["a"], choices_method="greedy_token_selection").method is (
        rg.greedy_token_selection
    )


class _FixedLogprobs:
    """Prompt logprobs from a table (the scoring arithmetic alone; the engine's own select
    runs in test_lang_engine.py). Rows from position P-1: the prefix's last token (id 1),
    then the choice's tokens as (logprob, id)."""

    def __init__(self, rows):
        self.rows = rows

    def prefill(self, text):
        return {"prompt_tokens": 3, "cached_tokens": 0}

    def prompt_logprobs(self, texts, logprob_start_len):
        return [[(None, 1)], *self.rows]


def test_greedy_token_selection_ties_on_a_shared_first_token():
    # Both choices start with token 7; its logprob differs in the last bits between the two
    # batch rows (CPU kernels round by shape). The second token decides: choice 0.
    rows = [[(-1.0, 1), (-1.0200001, 7), (-0.3, 8)], [(-1.0, 1), (-1.0199999, 7), (-4.0, 9)]]
    outcome = select_by_prompt_logprobs(
        _FixedLogprobs(rows), "x", ["a", "b"], ChoicesMethod.GREEDY_TOKEN_SELECTION
    )
    assert outcome.index == 0
    assert outcome.scores == [[-1.0200001, -0.3], [-1.0200001, -4.0]]
    # A different first token is not a tie: the higher logprob wins there.
    rows[1][1] = (-1.0199999, 6)
    outcome = select_by_prompt_logprobs(
        _FixedLogprobs(rows), "x", ["a", "b"], ChoicesMethod.GREEDY_TOKEN_SELECTION
    )
    assert outcome.index == 1


def test_gen_options_merge_over_run_defaults_into_one_request():
    own = rg.gen("x", max_tokens=5, stop="\n").options
    run_defaults = {"max_new_tokens": 50, "temperature": 0.0}
    request = build_request({**run_defaults, **own}, text="Q: ")
    params = request.sampling_params
    assert params.max_new_tokens == 5 and params.temperature == 0.0 and params.stop == ["\n"]
    assert request_options(request) == {
        "sampling_params": {"max_new_tokens": 5, "temperature": 0.0, "stop": ["\n"]}
    }


def test_top_p_zero_is_refused_by_the_dsl_as_by_the_runtime():
    # One rule everywhere (SGLang's and vLLM's): greedy is temperature=0, not top_p=0.
    with pytest.raises(ValueError, match=r"top_p must be > 0 \(use temperature=0 for greedy\)"):
        rg.gen("x", top_p=0.0)
    with pytest.raises(ValueError, match=r"top_p must be > 0 \(use temperature=0 for greedy\)"):
        build_request({"top_p": 0.0}, text="hi")


# ---- chat templates ----------------------------------------------------------------------


def _render_like_hf(template: str, messages, bos_token=None) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, bos_token=bos_token or "")


@pytest.mark.parametrize("template,bos", [(CHAT_TEMPLATE, None), (LLAMA_LIKE_TEMPLATE, "<s>")])
def test_transcript_reproduces_the_chat_template(template, bos):
    chat = derive_chat_template(jinja_renderer(template, {"bos_token": bos}), bos)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    transcript = Transcript()
    for message in messages:
        transcript.begin_role(message["role"], chat)
        transcript.add_text(message["content"])
        transcript.end_role(message["role"], chat)
    expected = _render_like_hf(template, messages, bos)
    # The runtime's tokenizer adds BOS itself, so the rendered text starts after it.
    assert transcript.text == (expected[len(bos) :] if bos else expected)
    assert transcript.messages == messages


def test_template_without_system_role_supports_the_others():
    chat = derive_chat_template(jinja_renderer(NO_SYSTEM_TEMPLATE, {}))
    assert chat.begin("user", is_first_message=True) == "<turn>user\n"
    assert chat.end("assistant") == "</turn>\n"
    with pytest.raises(rg.UnsupportedFeatureError, match="'system'"):
        chat.begin("system", is_first_message=True)


def test_transcript_rejects_nested_and_unmatched_roles():
    chat = derive_chat_template(jinja_renderer(CHAT_TEMPLATE, {}))
    transcript = Transcript()
    transcript.begin_role("user", chat)
    with pytest.raises(rg.RoleNestingError):
        transcript.begin_role("assistant", chat)
    with pytest.raises(rg.RoleNestingError):
        transcript.end_role("assistant", chat)
    transcript.add_text("partial")
    assert transcript.messages_with_open() == [{"role": "user", "content": "partial"}]


# ---- prefix tracing ----------------------------------------------------------------------


def test_trace_prefix_stops_at_the_first_generation():
    chat = derive_chat_template(jinja_renderer(CHAT_TEMPLATE, {}))
    calls = []

    def program(s, topic):
        with s.system():
            s += "You write haiku."
        s += rg.user("About " + topic)
        s += rg.assistant(rg.gen("poem"))
        calls.append("after gen")  # never reached in a dry run
        s += "unreachable"

    prefixes = [trace_prefix(program, (), {"topic": t}, lambda: chat) for t in ("sea", "sky")]
    system = "<|im_start|>system\nYou write haiku.<|im_end|>\n"
    assert prefixes[0] == system + "<|im_start|>user\nAbout sea<|im_end|>\n<|im_start|>assistant\n"
    assert common_prefix(prefixes) == system + "<|im_start|>user\nAbout s"
    assert calls == []


def test_trace_prefix_survives_reads_and_errors():
    chat = derive_chat_template(jinja_renderer(CHAT_TEMPLATE, {}))

    def reads_first(s):
        s += "Intro. "
        if s["flag"]:  # a read needs a real value: the trace ends here
            s += "never"

    def raises(s):
        s += "Start"
        raise RuntimeError("user bug")

    assert trace_prefix(reads_first, (), {}, lambda: chat) == "Intro. "
    assert trace_prefix(raises, (), {}, lambda: chat) == "Start"


# ---- streaming log -----------------------------------------------------------------------


def test_text_stream_readers_see_every_chunk_in_order():
    stream = TextStream()
    seen: list[list[str]] = [[], []]

    def read(index, var_name):
        seen[index].extend(stream.iter_text(var_name))

    readers = [
        threading.Thread(target=read, args=(0, None)),
        threading.Thread(target=read, args=(1, "b")),
    ]
    for reader in readers:
        reader.start()
    stream.append_text("x")
    for i in range(20):
        stream.append_text(str(i), "b")
    stream.end_var("b")
    stream.append_text("y", "c")
    stream.close()
    for reader in readers:
        reader.join(timeout=5)
    assert seen[0] == ["x", *map(str, range(20)), "y"]
    assert seen[1] == list(map(str, range(20)))


def test_text_stream_reraises_the_program_error():
    stream = TextStream()
    stream.append_text("partial")
    stream.close(ValueError("boom"))
    chunks = []
    with pytest.raises(ValueError, match="boom"):
        for chunk in stream.iter_text():
            chunks.append(chunk)
    assert chunks == ["partial"]


# ---- programs without a backend ---------------------------------------------------------


@rg.function
def echo(s, word, times=1):
    s += word * times


def test_missing_backend_is_a_clear_error(monkeypatch):
    monkeypatch.setattr("radixgen.context.DEFAULT_CONTEXT", BackendContext())
    with pytest.raises(rg.NoBackendError, match="set_default_backend"):
        echo.run(word="a")


def test_program_arguments_are_checked_against_the_signature():
    with pytest.raises(TypeError, match="'echo'"):
        echo.bind(colour="red")
    with pytest.raises(TypeError, match="first argument"):
        rg.function(lambda: None)
    with pytest.raises(TypeError, match="list of dicts"):
        echo.run_batch(["a"])
    with pytest.raises(ValueError, match="num_threads"):
        echo.run_batch([{"word": "a"}], num_threads=0)
    with pytest.raises(TypeError, match="word"):
        echo.run_batch([{"word": "a"}], word="b")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_server_is_a_clear_error():
    url = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(rg.BackendUnreachableError, match="radixgen serve"):
        rg.RuntimeEndpoint(url)
    with pytest.raises(ValueError, match="base_url"):
        rg.RuntimeEndpoint("localhost:30000")


def test_import_stays_light():
    code = (
        "import sys, radixgen as rg\n"
        "heavy = [m for m in ('torch', 'transformers', 'httpx', 'openai') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""
