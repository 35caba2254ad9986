"""SGLang's `structural_tag` as a Lark grammar for llguidance: free text until a trigger, then a
schema-constrained body between a begin and an end tag, then free text again.

    {"structures": [{"begin": "<function=get_weather>", "schema": {...}, "end": "</function>"}],
     "triggers": ["<function="]}

The output is `FREE (TRIGGERED rest-of-begin BODY end)* FREE`: free text never contains a
trigger except where a tag starts; once a trigger is written, the output must continue with
the rest of one structure's `begin` (among those starting with that trigger), a body matching
its `schema` exactly (radixgen's own translation, `json_schema_to_regex`), and its `end`.

Two lexemes carry the free text, because llguidance lexes greedily and one byte ahead (a plain
"any text" lexeme would swallow the trigger): a lazy one that ends at the first occurrence of
trigger i (`(?s:.*)TRIGGER`, shortest match), and a final one that contains no trigger at all.
A trigger that contains another trigger could never end its lazy lexeme first, so it is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from radixgen.constrained.constraint_spec import escape_regex_literal
from radixgen.constrained.json_schema import json_schema_to_regex
from radixgen.constrained.schema_lark import lark_terminal
from radixgen.constrained.unsupported import UnsupportedSchemaError


@dataclass(frozen=True)
class TagStructure:
    """One tagged body: `begin`, then JSON matching `schema` (compact JSON text), then `end`."""

    begin: str
    schema: str
    end: str


@dataclass(frozen=True)
class StructuralTag:
    """Structures and the triggers that start them (each `begin` starts with one trigger)."""

    structures: tuple[TagStructure, ...]
    triggers: tuple[str, ...]

    @classmethod
    def from_json(cls, text: str) -> StructuralTag:
        """From the canonical JSON text (`{"structures": [...], "triggers": [...]}`), as
        `ConstraintSpec.structural_tag` writes it.

        Raises:
            ValueError: naming the part of `structural_tag` that is malformed.
        """
        try:
            value = json.loads(text)
            structures = tuple(
                TagStructure(item["begin"], json.dumps(item["schema"]), item["end"])
                for item in value["structures"]
            )
            tag = cls(structures, tuple(value["triggers"]))
            texts = [*tag.triggers, *(s.begin for s in structures), *(s.end for s in structures)]
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"structural_tag is malformed: {error!r}") from None
        if not structures or not tag.triggers or not all(isinstance(t, str) for t in texts):
            raise ValueError("structural_tag needs structures and triggers, all texts strings")
        if not all(tag.triggers) or not all(s.begin for s in structures):
            raise ValueError("structural_tag: triggers and begins must be non-empty")
        tag.check()
        return tag

    def check(self) -> None:
        """Raises ValueError where a trigger or begin would make the grammar wrong."""
        for index, trigger in enumerate(self.triggers):
            for other in self.triggers[index + 1 :]:
                if trigger in other or other in trigger:
                    raise ValueError(
                        f"structural_tag.triggers: {trigger!r} and {other!r} overlap (one "
                        "contains the other); give triggers that do not contain each other"
                    )
        for index, structure in enumerate(self.structures):
            if self.trigger_of(structure) is None:
                raise ValueError(
                    f"structural_tag.structures[{index}].begin {structure.begin!r} must start "
                    f"with one of the triggers {list(self.triggers)}"
                )

    def trigger_of(self, structure: TagStructure) -> str | None:
        """The trigger `structure.begin` starts with (at most one: triggers do not overlap)."""
        return next((t for t in self.triggers if structure.begin.startswith(t)), None)


def structural_tag_lark(tag: StructuralTag) -> str:
    """The Lark grammar (llguidance dialect) of `tag`.

    Raises:
        UnsupportedSchemaError: a structure's schema radixgen cannot enforce exactly (its
            path is prefixed with the structure's).
    """
    free_any = "|".join(escape_regex_literal(trigger) for trigger in tag.triggers)
    rules = [f"FREE: ~{lark_terminal(f'(?s:.*(?:{free_any}).*)')}"]
    triggered = []
    for trigger_index, trigger in enumerate(tag.triggers):
        branches = []
        for index, structure in enumerate(tag.structures):
            if tag.trigger_of(structure) != trigger:
                continue
            rest = structure.begin[len(trigger) :]
            parts = [_literal(rest)] if rest else []
            parts.append(_body_terminal(rules, index, structure.schema))
            if structure.end:
                parts.append(_literal(structure.end))
            branches.append(" ".join(parts))
        if not branches:
            continue  # a trigger no structure uses: it stays forbidden in free text
        lazy_text = lark_terminal(f"(?s:.*){escape_regex_literal(trigger)}")
        rules.append(f"text_{trigger_index}[lazy]: {lazy_text}")
        triggered.append(f"text_{trigger_index} ({' | '.join(branches)})")
    if not triggered:
        raise ValueError("structural_tag: no structure starts with any trigger")
    rules.insert(0, f"start: ({' | '.join(triggered)})* FREE")
    return "\n".join(rules)


def _literal(text: str) -> str:
    return lark_terminal(escape_regex_literal(text))


def _body_terminal(rules: list[str], index: int, schema_text: str) -> str:
    try:
        regex = json_schema_to_regex(json.loads(schema_text))
    except UnsupportedSchemaError as error:
        path = f"structural_tag.structures[{index}].schema{error.path.removeprefix('#')}"
        raise type(error)(error.keyword, path, error.reason) from None
    name = f"BODY_{index}"
    rules.append(f"{name}: {lark_terminal(regex)}")
    return name
