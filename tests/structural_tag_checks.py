"""What tests check of a text generated under a structural tag: every trigger opens a tag whose
body validates against its structure's schema (`jsonschema`), and only a text cut by the token
budget may end inside a tag."""

from __future__ import annotations

import json

import jsonschema

# Triggers the tiny code model writes often ("e"), so that tags open within a few tokens.
COUNTER_TAG = {
    "type": "structural_tag",
    "structures": [
        {"begin": "e=", "schema": {"type": "integer", "minimum": 0, "maximum": 99}, "end": ";"},
        {"begin": "e:", "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}},
                                   "required": ["ok"], "additionalProperties": False}, "end": "|"},
    ],
    "triggers": ["e"],
}  # fmt: skip


def check_tagged_text(text: str, tag: dict, *, finished_by_length: bool) -> list[object]:
    """The parsed bodies of `text`'s tags, after asserting the rules above."""
    bodies, position = [], 0
    while True:
        hits = [(text.find(t, position), t) for t in tag["triggers"] if t in text[position:]]
        if not hits:
            return bodies
        start, trigger = min(hits, key=lambda hit: hit[0] + len(hit[1]))
        rest = text[start:]
        opened = [s for s in tag["structures"] if s["begin"].startswith(trigger)]
        structure = next((s for s in opened if rest.startswith(s["begin"])), None)
        end = -1 if structure is None else rest.find(structure["end"], len(structure["begin"]))
        if structure is None or end < 0:
            # Only the last tag may be open, and only when the budget cut the output.
            assert finished_by_length, f"an unfinished tag at {start} in {text!r}"
            assert any(s["begin"].startswith(rest) or rest.startswith(s["begin"]) for s in opened)
            return bodies
        body = json.loads(rest[len(structure["begin"]) : end])
        jsonschema.validate(body, structure["schema"])
        bodies.append(body)
        position = start + end + len(structure["end"])
