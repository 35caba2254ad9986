"""JSON extraction: facts about a Python function (its name and parameters), read from its
source by the model, as JSON that always validates against the schema.

    python examples/json_extraction.py [--model-path DIR | --url URL] [--max-new-tokens N]

The schema is built from each source: names must be identifiers that occur in it (an `enum`),
so a small model picks among them rather than spelling them out, and decoding can never
produce a name that is not there. Two worked examples before the source show the format.
"""

from __future__ import annotations

import json
import keyword
import re

from example_utils import run_main

import radixgen as rg

WORKED_EXAMPLES = [
    (
        'def greet(name, punctuation="!"):\n    return "Hello, " + name + punctuation\n',
        {"function": "greet", "parameters": ["name", "punctuation"]},
    ),
    ("def total(items):\n    return sum(items)\n", {"function": "total", "parameters": ["items"]}),
    (
        "def move(point, dx, dy):\n    return point.x + dx, point.y + dy\n",
        {"function": "move", "parameters": ["point", "dx", "dy"]},
    ),
]
SOURCES = [
    'def read_config(path, encoding="utf-8"):\n'
    "    with open(path, encoding=encoding) as f:\n"
    "        return f.read()\n",
    "def send_email(to, subject, body, retries=3):\n"
    "    for attempt in range(retries):\n"
    "        deliver(to, subject, body)\n",
]


def facts_schema(source: str) -> dict:
    """A JSON schema whose names are the identifiers (not keywords) found in `source`."""
    names = sorted({w for w in re.findall(r"[A-Za-z_]\w*", source) if not keyword.iskeyword(w)})
    return {
        "type": "object",
        "properties": {
            "function": {"enum": names},
            "parameters": {"type": "array", "items": {"enum": names}, "maxItems": 6},
        },
        "required": ["function", "parameters"],
        "additionalProperties": False,
    }


def show(source: str, facts: str = "") -> str:
    """The source, then its facts on a comment line (compact JSON, as decoding writes it)."""
    return f"{source}\n# facts: {facts}"


PROMPT_HEADER = "".join(
    show(source, json.dumps(facts, separators=(",", ":"))) + "\n\n\n"
    for source, facts in WORKED_EXAMPLES
)


@rg.function
def extract(s, source, json_tokens):
    s += PROMPT_HEADER + show(source)
    s += rg.gen("facts", json_schema=facts_schema(source), max_tokens=json_tokens)


def run_example(backend, max_new_tokens: int = 64) -> list[dict]:
    states = extract.run_batch(
        [{"source": source, "json_tokens": max_new_tokens} for source in SOURCES],
        backend=backend,
        temperature=0.0,
        progress_bar=False,
    )
    results = []
    for source, state in zip(SOURCES, states, strict=True):
        if state.error is not None:
            raise state.error
        if _finish_type(state.get_meta_info("facts")["finish_reason"]) == "length":
            # Cut by the budget the JSON is still valid (budget-aware masks closed it in
            # time), but its values were shortened to fit: ask for more tokens.
            raise SystemExit(
                f"the JSON for {source.splitlines()[0]!r} was cut off at {max_new_tokens} "
                "tokens: raise --max-new-tokens"
            )
        facts = json.loads(state["facts"])
        print(f"{source.splitlines()[0]}\n  -> {facts}")
        results.append(facts)
    return results


def _finish_type(finish_reason) -> str | None:
    """'length', 'stop'...: a dict's type (Engine, RuntimeEndpoint) or a string (OpenAI)."""
    return finish_reason.get("type") if isinstance(finish_reason, dict) else finish_reason


def main() -> None:
    run_main(run_example, __doc__, max_new_tokens=64)


if __name__ == "__main__":
    main()
