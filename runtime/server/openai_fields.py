"""What the OpenAI endpoints make of the fields beyond plain sampling: the constraint, from
whichever of OpenAI's, SGLang's and vLLM's names the client used, and the fields refused.

    radixgen      OpenAI                     SGLang (extra_body)   vLLM (extra_body)
    json_schema   response_format            json_schema           guided_json, structured_outputs.json
                  {type: json_schema}
    json_object   response_format            -                     structured_outputs.json_object
                  {type: json_object}
    regex         -                          regex                 guided_regex, structured_outputs.regex
    choices       -                          choices               guided_choice, structured_outputs.choice
    ebnf          -                          ebnf                  guided_grammar, structured_outputs.grammar
    lark          -                          lark (radixgen's)     -
    structural_tag response_format           structural_tag        structured_outputs.structural_tag
                  {type: structural_tag}

At most one of them per request: two names for constraints is a 400 naming the second.
"""

from __future__ import annotations

from typing import Any

from radixgen.runtime.request_fields import CONSTRAINT_FIELDS, FIELD_BOUNDS, RequestFieldError
from radixgen.runtime.server.errors import RequestError
from radixgen.runtime.server.openai_protocol import UNSUPPORTED_FIELDS, SamplingExtras


def reject_unsupported(body: SamplingExtras) -> None:
    """Raises RequestError(400) naming the first field set that radixgen cannot serve."""
    if body.best_of is not None:
        try:
            FIELD_BOUNDS["best_of"].check("best_of", body.best_of)
        except RequestFieldError as error:
            raise RequestError(str(error), param="best_of") from None
        if body.best_of != body.n:
            raise RequestError("best_of other than n is not supported", param="best_of")
    for name in UNSUPPORTED_FIELDS:
        value = getattr(body, name, None)
        if name != "best_of" and value not in (None, False, [], ""):
            raise RequestError(f"{name} is not supported by radixgen", param=name)
    modalities = getattr(body, "modalities", None)
    if modalities and modalities != ["text"]:
        raise RequestError(
            "only text output is supported (modalities ['text'])", param="modalities"
        )


def constraint_fields(body: SamplingExtras) -> dict[str, Any]:
    """The constraint sampling fields of `body`, whatever names it used (validated later)."""
    sources = [  # (the field as the client named it, radixgen's field, value)
        ("regex", "regex", body.regex),
        ("choices", "choices", body.choices),
        ("ebnf", "ebnf", body.ebnf),
        ("lark", "lark", body.lark),
        ("structural_tag", "structural_tag", body.structural_tag),
        ("json_schema", "json_schema", body.json_schema),
        ("guided_json", "json_schema", body.guided_json),
        ("guided_regex", "regex", body.guided_regex),
        ("guided_choice", "choices", body.guided_choice),
        ("guided_grammar", "ebnf", body.guided_grammar),
        *_structured_outputs(body),
        *_response_format(body),
    ]
    given = [(name, field, value) for name, field, value in sources if value not in (None, False)]
    if len(given) > 1:
        raise RequestError(
            f"at most one of the constraints per request; got {[name for name, _, _ in given]}",
            param=given[1][0],
        )
    fields: dict[str, Any] = {"constraint_budget": body.constraint_budget}
    for _, field, value in given:
        fields[field] = value
    return fields


def given_constraints(fields: dict[str, Any]) -> list[str]:
    """The constraint fields set in sampling fields `fields`."""
    return [name for name in CONSTRAINT_FIELDS if fields.get(name) not in (None, False)]


def _structured_outputs(body: SamplingExtras) -> list[tuple[str, str, Any]]:
    outputs = body.structured_outputs
    if outputs is None:
        return []
    return [
        ("structured_outputs.json", "json_schema", outputs.json_),
        ("structured_outputs.regex", "regex", outputs.regex),
        ("structured_outputs.choice", "choices", outputs.choice),
        ("structured_outputs.grammar", "ebnf", outputs.grammar),
        ("structured_outputs.json_object", "json_object", outputs.json_object),
        ("structured_outputs.structural_tag", "structural_tag", outputs.structural_tag),
    ]


def _response_format(body: SamplingExtras) -> list[tuple[str, str, Any]]:
    response_format = body.response_format
    if response_format is None or response_format.type == "text":
        return []
    if response_format.type == "json_object":
        # JSON mode: any JSON object (the grammar backend's own JSON grammar).
        return [("response_format", "json_object", True)]
    if response_format.type == "structural_tag":
        tag = {"structures": response_format.structures, "triggers": response_format.triggers}
        return [("response_format", "structural_tag", tag)]
    if response_format.json_schema is None or response_format.json_schema.schema_ is None:
        raise RequestError(
            "response_format of type json_schema needs json_schema.schema",
            param="response_format",
        )
    return [("response_format", "json_schema", response_format.json_schema.schema_)]
