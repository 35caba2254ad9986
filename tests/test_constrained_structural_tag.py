"""SGLang's structural tag on llguidance: free text, trigger, begin, schema body, end, free text.

The compiled grammar is checked against a plain-Python reading of the same rules on fixed and
random texts, and malformed tags are refused naming the part.
"""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest

from radixgen.constrained import ConstraintSpec, UnsupportedSchemaError, compile_constraint

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}},
    "required": ["city"],
    "additionalProperties": False,
}
TIME = {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"]}
COUNT = {"type": "integer", "minimum": 0}
TAG = {
    "type": "structural_tag",
    "structures": [
        {"begin": "<function=get_weather>", "schema": WEATHER, "end": "</function>"},
        {"begin": "<function=get_time>", "schema": TIME, "end": "</function>"},
        {"begin": "<tool>", "schema": COUNT, "end": "</tool>"},
    ],
    "triggers": ["<function=", "<tool>"],
}


@pytest.fixture(scope="module")
def checker():
    return compile_constraint(structural_tag=TAG)


def reference_fullmatch(text: str, tag: dict) -> bool:
    """The rules in plain Python: free text up to the first trigger occurrence, which must
    start one of its structures (rest of begin, a body valid for the schema, end); repeat."""
    triggers = tag["triggers"]
    position = 0
    while True:
        hits = [(text.find(t, position), t) for t in triggers if text.find(t, position) >= 0]
        if not hits:
            return True  # free text to the end
        start, trigger = min(hits, key=lambda hit: hit[0] + len(hit[1]))
        for structure in tag["structures"]:
            if not structure["begin"].startswith(trigger):
                continue
            if not text.startswith(structure["begin"], start):
                continue
            body_start = start + len(structure["begin"])
            end = text.find(structure["end"], body_start)
            if end < 0:
                continue
            try:
                jsonschema.validate(json.loads(text[body_start:end]), structure["schema"])
            except (ValueError, jsonschema.ValidationError):
                continue
            compact = json.dumps(json.loads(text[body_start:end]), separators=(",", ":"))
            if compact != text[body_start:end]:
                continue  # bodies are written compactly, as every constraint's JSON
            position = end + len(structure["end"])
            break
        else:
            return False


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", True),
        ("plain text, no tags\n", True),
        ('I will check. <function=get_weather>{"city":"Paris"}</function> Done.', True),
        ('<function=get_weather>{"city":"a"}</function><function=get_time>{"tz":"UTC"}</function>', True),
        ("<tool>12</tool>\n<tool>0</tool>", True),
        ("a <func b <too", True),  # prefixes of triggers are free text
        ('x<function=get_weather>{"city":1}</function>', False),  # body breaks its schema
        ('x<function=get_weather>{"city":"much too long"}</function>', False),
        ("x<function=get_stock>{}</function>", False),  # no such structure
        ('<function=get_weather>{"city":"a"}', False),  # no end tag
        ("x <function=", False),
        ("<tool>-1</tool>", False),
        ('<tool>b<function=get_time>{"tz":"UTC"}</function>', False),  # a trigger must open a tag
    ],
)  # fmt: skip
def test_tagged_bodies_are_exact(checker, text, expected):
    assert reference_fullmatch(text, TAG) == expected, "the reference disagrees with the case"
    assert checker.fullmatch(text) == expected


def test_random_texts_match_the_reference(checker):
    pieces = ["a", " ", "\n", "<", "<tool>", "</tool>", "<function=", "<func", "get_weather>",
              "get_time>", '{"city":"Oslo"}', '{"tz":"CET"}', '{"tz":"EST"}', "7", "-", "</function>"]  # fmt: skip
    rng = random.Random(0)
    agreed = matched = 0
    for _ in range(400):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
        expected = reference_fullmatch(text, TAG)
        assert checker.fullmatch(text) == expected, text
        agreed += 1
        matched += expected
    assert agreed == 400 and 50 < matched < 350  # both outcomes exercised


def test_outlines_refuses_structural_tags():
    with pytest.raises(
        ValueError, match="structural_tag constraints need grammar_backend='llguidance'"
    ):
        compile_constraint(structural_tag=TAG, backend="outlines")


@pytest.mark.parametrize(
    ("tag", "message"),
    [
        ({**TAG, "triggers": ["<tool>"]}, r"structures\[0\]\.begin '<function=get_weather>' must start with one of the triggers"),
        ({**TAG, "triggers": ["<function=", "<function=get"]}, "overlap"),
        ({**TAG, "type": "json_schema"}, "takes type"),
        ({**TAG, "extra": 1}, "takes type"),
        ({"structures": [], "triggers": ["<"]}, "needs structures and triggers"),
        ({"structures": [{"begin": "<a>", "end": "</a>"}], "triggers": ["<a>"]}, "malformed"),
        ("{not json", "not valid JSON"),
    ],
)  # fmt: skip
def test_malformed_tags_are_refused_naming_the_part(tag, message):
    with pytest.raises(ValueError, match=message):
        ConstraintSpec.structural_tag(tag)


def test_an_unsupported_body_schema_names_its_structure():
    tag = {"structures": [{"begin": "<a>", "schema": {"$ref": "https://x/y.json"}, "end": "</a>"}],
           "triggers": ["<a>"]}  # fmt: skip
    with pytest.raises(
        UnsupportedSchemaError, match=re.escape("structural_tag.structures[0].schema")
    ):
        compile_constraint(structural_tag=tag)


@pytest.mark.parametrize(
    "trigger", ["[TOOL_CALLS]", "<|python_tag|>", "</x", "a/b", '"q"', "\\n", "<tool_call>\n"]
)
def test_triggers_with_regex_and_lark_syntax_are_literal(trigger):
    tag = {"structures": [{"begin": trigger + "f", "schema": {"type": "integer"}, "end": "."}],
           "triggers": [trigger]}  # fmt: skip
    checker = compile_constraint(structural_tag=tag)
    assert checker.fullmatch(f"hi {trigger}f12. ok") and checker.fullmatch("hi")
    assert not checker.fullmatch(f"hi {trigger}g") and not checker.fullmatch(f"{trigger}fx.")
