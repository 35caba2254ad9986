"""The user-facing constructors: `rg.gen`, `rg.select` and the role helpers."""

from __future__ import annotations

from typing import Any

from radixgen.ir import (
    ChoicesMethod,
    Expr,
    Gen,
    RoleBegin,
    RoleEnd,
    Select,
    check_choices_method,
    role_expr,
)
from radixgen.runtime.request_schema import tool_call_schema, tool_definitions, validate_fields

# How errors name the fields that rg.gen spells differently (it follows OpenAI's names).
_GEN_DISPLAY_NAMES = {
    "max_new_tokens": "max_new_tokens (rg.gen's max_tokens)",
    "min_new_tokens": "min_new_tokens (rg.gen's min_tokens)",
}


def gen(
    name: str | None = None,
    *,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    repetition_penalty: float | None = None,
    ignore_eos: bool | None = None,
    seed: int | None = None,
    regex: str | None = None,
    json_schema: Any = None,
    choices: list[str] | None = None,
    ebnf: str | None = None,
    lark: str | None = None,
    structural_tag: dict | str | None = None,
    constraint_budget: bool | None = None,
    return_logprob: bool | None = None,
    top_logprobs_num: int | None = None,
    tools: list[dict] | None = None,
    lora_path: str | None = None,
) -> Gen:
    """Generate text at this point of the program and store it as `s[name]`.

    Unset options fall back to the defaults given to `prog.run(...)`, then to the
    backend's. At most one constraint: `regex`, `json_schema` (a dict, a JSON string or a
    pydantic model class), `choices` (decoding constrained to one of the strings; for
    likelihood scoring without sampling use `rg.select`), `ebnf` (a GBNF-style grammar whose
    start rule is `root`), `lark` (a Lark grammar whose start rule is `start`) or
    `structural_tag` (SGLang's: `{"structures": [{"begin", "schema", "end"}], "triggers"}`:
    free text whose tagged bodies match their schemas); grammars and structural tags need
    the llguidance grammar backend (the default). A constrained output cut by
    `max_tokens` still ends as a complete match unless `constraint_budget=False`.

    `tools` (OpenAI's function definitions, `[{"type": "function", "function": {"name",
    "parameters"}}]`) makes the output one call of one of them, its arguments under the
    function's JSON schema: `s[name]` is the parsed call `{"name": ..., "arguments": {...}}`
    (the text appended to the program is its JSON). It is a constraint: no other one with it.

    `lora_path` names a LoRA adapter loaded by the runtime (docs/lora.md) for this gen; a
    run's default comes from `prog.run(lora_path=...)`.

    Raises:
        TypeError / ValueError naming the bad argument.
    """
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a string or None, got {name!r}")
    given = dict(
        max_new_tokens=max_tokens,
        min_new_tokens=min_tokens,
        stop=stop,
        stop_token_ids=stop_token_ids,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        repetition_penalty=repetition_penalty,
        ignore_eos=ignore_eos,
        seed=seed,
        regex=regex,
        json_schema=json_schema,
        choices=choices,
        ebnf=ebnf,
        lark=lark,
        structural_tag=structural_tag,
        constraint_budget=constraint_budget,
        return_logprob=return_logprob,
        top_logprobs_num=top_logprobs_num,
        lora_path=lora_path,
    )
    if tools is not None:
        others = [c for c in ("regex", "json_schema", "choices", "ebnf", "lark", "structural_tag")
                  if given[c] is not None]  # fmt: skip
        if others:
            raise ValueError(f"tools constrain the output; give no {others[0]} with them")
        given["json_schema"] = tool_call_schema(tool_definitions(tools))
    # Checked field by field now, so a bad argument fails at the line that wrote it; the
    # whole request is validated once merged with the run's defaults (executor.py).
    options = validate_fields(
        {option: value for option, value in given.items() if value is not None},
        display_names=_GEN_DISPLAY_NAMES,
    )
    return Gen(name, options, parses_tool_call=tools is not None)


def select(
    name: str | None = None,
    choices: list[str] | None = None,
    *,
    choices_method: ChoicesMethod | str = ChoicesMethod.TOKEN_LENGTH_NORMALIZED,
) -> Select:
    """Append the choice the model finds most likely, and store it as `s[name]`.

    Scores come from one prefill of the text so far plus the prompt logprobs of each
    choice; nothing is sampled. `s.get_meta_info(name)["scores"]` holds the score of each
    choice (the pick is their argmax).

    Raises:
        ValueError: `choices` is empty or `choices_method` is unknown.
        TypeError: `choices` is not a list of strings.
    """
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a string or None, got {name!r}")
    if choices is None or isinstance(choices, str):
        raise TypeError(f"choices must be a list of strings, got {choices!r}")
    if not isinstance(choices, (list, tuple)) or not all(isinstance(c, str) for c in choices):
        raise TypeError(f"choices must be a list of strings, got {choices!r}")
    if len(choices) == 0:
        raise ValueError("select(choices=...) needs at least one choice, got []")
    if any(choice == "" for choice in choices):
        raise ValueError("select choices must be non-empty strings")
    return Select(name, tuple(choices), check_choices_method(choices_method))


def system(expr: Any = None) -> Expr:
    """`expr` as a system message (formatted by the backend's chat template)."""
    return role_expr("system", expr)


def user(expr: Any = None) -> Expr:
    """`expr` as a user message (formatted by the backend's chat template)."""
    return role_expr("user", expr)


def assistant(expr: Any = None) -> Expr:
    """`expr` as an assistant message; a gen inside it is the model's reply."""
    return role_expr("assistant", expr)


def system_begin() -> RoleBegin:
    return RoleBegin("system")


def system_end() -> RoleEnd:
    return RoleEnd("system")


def user_begin() -> RoleBegin:
    return RoleBegin("user")


def user_end() -> RoleEnd:
    return RoleEnd("user")


def assistant_begin() -> RoleBegin:
    return RoleBegin("assistant")


def assistant_end() -> RoleEnd:
    return RoleEnd("assistant")
