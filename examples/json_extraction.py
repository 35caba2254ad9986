"""JSON extraction: a pydantic model as the schema; the output always validates.

    python examples/json_extraction.py [--model-path DIR | --url URL] [--max-new-tokens N]

Decoding is constrained by the schema, so even the random `tiny` model produces a valid
`Person` (with made-up values).
"""

from __future__ import annotations

import pydantic
from example_utils import run_main

import radixgen as rg

DOCUMENTS = [
    "Ada Lovelace, born 1815, wrote the first published computer program.",
    "Alan Turing (1912) proposed the imitation game.",
]


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=24)
    birth_year: int = pydantic.Field(ge=1000, le=2100)
    is_scientist: bool


@rg.function
def extract(s, document, json_tokens):
    s += rg.system("Extract the person described in the text as JSON.")
    s += rg.user(document)
    s += rg.assistant(rg.gen("person", json_schema=Person, max_tokens=json_tokens))


def run_example(backend, max_new_tokens: int = 96) -> list[Person]:
    states = extract.run_batch(
        [{"document": d, "json_tokens": max_new_tokens} for d in DOCUMENTS],
        backend=backend,
        temperature=0.0,
        progress_bar=False,
    )
    people = []
    for document, state in zip(DOCUMENTS, states, strict=True):
        if state.error is not None:
            raise state.error
        if _finish_type(state.get_meta_info("person")["finish_reason"]) == "length":
            # Constrained output is valid JSON only once complete; a cut-off object is not.
            raise SystemExit(
                f"the JSON for {document!r} was cut off at {max_new_tokens} tokens: "
                "raise --max-new-tokens"
            )
        person = Person.model_validate_json(state["person"])
        print(f"{document!r}\n  -> {person!r}")
        people.append(person)
    return people


def _finish_type(finish_reason) -> str | None:
    """'length', 'stop'...: a dict's type (Engine, RuntimeEndpoint) or a string (OpenAI)."""
    return finish_reason.get("type") if isinstance(finish_reason, dict) else finish_reason


def main() -> None:
    run_main(run_example, __doc__, max_new_tokens=96)


if __name__ == "__main__":
    main()
