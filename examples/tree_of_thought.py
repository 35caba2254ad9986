"""Tree of thought: fork the state into several lines of reasoning that share the
question's KV (prefilled once), let each think, then let the model pick one.

    python examples/tree_of_thought.py [--model-path DIR | --url URL] [--max-new-tokens N]
"""

from __future__ import annotations

from example_utils import run_main

import radixgen as rg

NUM_BRANCHES = 3


@rg.function
def tree_of_thought(s, question, thought_tokens):
    s += rg.system("Think step by step, then answer.")
    s += rg.user_begin() + question + rg.user_end()
    s += rg.assistant_begin()
    branches = s.fork(NUM_BRANCHES)
    for index, branch in enumerate(branches):
        branch += f"Approach {index + 1}: "
        branch += rg.gen("thought", max_tokens=thought_tokens, stop="\n\n")
    branches.join()  # s["thought"] is now the list of the branches' thoughts
    for index, thought in enumerate(s["thought"]):
        s += f"Approach {index + 1}: {thought}\n"
    s += "The most convincing approach is number "
    s += rg.select("best", [str(i + 1) for i in range(NUM_BRANCHES)])
    s += rg.assistant_end()
    s["shared_prefill"] = branches.prefill_meta_info


def run_example(backend, max_new_tokens: int = 32) -> rg.ProgramState:
    state = tree_of_thought.run(
        question="How many weekdays are there in 3 weeks?",
        thought_tokens=max_new_tokens,
        temperature=0.8,
        backend=backend,
    )
    prefill = state["shared_prefill"]
    print(f"shared prefix: {prefill.get('prompt_tokens')} tokens, prefilled once")
    for index, thought in enumerate(state["thought"]):
        meta = state.get_meta_info("thought")[index]
        print(f"branch {index + 1} ({meta['cached_tokens']} tokens from cache): {thought!r}")
    print(f"best: approach {state['best']}")
    return state


def main() -> None:
    run_main(run_example, __doc__, max_new_tokens=32)


if __name__ == "__main__":
    main()
