"""A ReAct-style agent: the model picks an action from a fixed set (rg.select), writes
its input (regex-constrained), Python runs the tool, and the observation is appended.

    python examples/react_agent.py [--model-path DIR | --url URL] [--max-new-tokens N]

The embedded `tiny` model is a code model, not a chat model: its actions are arbitrary but
always valid, and the loop ends after `max_steps` if it never picks "finish". Use
--model-path with a chat model for a meaningful agent.
"""

from __future__ import annotations

import ast
import operator

from example_utils import run_main

import radixgen as rg

CAPITALS = {"france": "Paris", "japan": "Tokyo", "peru": "Lima"}
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculator(expression: str) -> str:
    """Evaluates + - * over integers (no eval of arbitrary code)."""

    def evaluate(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](evaluate(node.left), evaluate(node.right))
        raise ValueError("unsupported expression")

    try:
        return str(evaluate(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError):
        return "error: not an arithmetic expression"


def lookup_capital(country: str) -> str:
    return CAPITALS.get(country.strip().lower(), "unknown country")


TOOLS = {"calculator": calculator, "capital": lookup_capital}
# Tool inputs the model may write: arithmetic or a single word.
TOOL_INPUT_REGEX = r"[0-9]{1,4}( [+*-] [0-9]{1,4}){0,3}|[A-Za-z]{1,12}"


@rg.function
def agent(s, task, max_steps, thought_tokens):
    s += "Answer the task using tools: calculator (arithmetic), capital (a country).\n"
    s += f"Task: {task}\n"
    for step in range(max_steps):
        s += "Thought: " + rg.gen(f"thought_{step}", max_tokens=thought_tokens, stop="\n")
        # The first step must consult a tool; later steps may finish.
        actions = list(TOOLS) if step == 0 else [*TOOLS, "finish"]
        s += "\nAction: " + rg.select(f"action_{step}", actions)
        if s[f"action_{step}"] == "finish":
            s += "\nFinal answer: " + rg.gen("answer", max_tokens=thought_tokens, stop="\n")
            return
        s += "\nInput: " + rg.gen(f"input_{step}", regex=TOOL_INPUT_REGEX)
        observation = TOOLS[s[f"action_{step}"]](s[f"input_{step}"])
        s += f"\nObservation: {observation}\n"
    s["answer"] = None  # ran out of steps


def run_example(backend, max_new_tokens: int = 16) -> rg.ProgramState:
    state = agent.run(
        task="What is 12 * 7, and what is the capital of Peru?",
        max_steps=3,
        thought_tokens=max_new_tokens,
        temperature=0.0,
        backend=backend,
    )
    print(state.text())
    print(f"answer: {state['answer']!r}")
    return state


def main() -> None:
    run_main(run_example, __doc__, max_new_tokens=16)


if __name__ == "__main__":
    main()
