"""Best of several drafts: fork a function stub into branches that share its KV (prefilled
once), sample a completion in each, and keep the one the model finds most likely.

    python examples/best_of_drafts.py [--model-path DIR | --url URL] [--max-new-tokens N]

Each draft is scored by its mean token logprob (`return_logprob=True`), so drafts of
different lengths compare fairly.
"""

from __future__ import annotations

from example_utils import run_main

import radixgen as rg

NUM_DRAFTS = 4
STUB = 'def read_lines(path):\n    """Return the lines of a text file."""'
END_OF_DEFINITION = ["\n\n\n", "\ndef ", "\nclass "]


@rg.function
def best_of_drafts(s, stub, draft_tokens):
    s += stub
    drafts = s.fork(NUM_DRAFTS)
    for index, draft in enumerate(drafts):
        draft += rg.gen(
            "draft",
            max_tokens=draft_tokens,
            stop=END_OF_DEFINITION,
            temperature=0.8,
            seed=index + 1,  # a different, reproducible sample per branch
            return_logprob=True,
        )
    drafts.join()  # s["draft"] is now the list of the branches' drafts
    s["mean_logprobs"] = [mean_logprob(draft.get_meta_info("draft")) for draft in drafts]
    s["cached_tokens"] = [draft.get_meta_info("draft")["cached_tokens"] for draft in drafts]
    best = max(range(NUM_DRAFTS), key=lambda index: s["mean_logprobs"][index])
    s += s["draft"][best]
    s["best"] = best


def mean_logprob(meta_info: dict) -> float:
    """The mean logprob of a completion's tokens (-inf for an empty one)."""
    logprobs = [logprob for logprob, _ in meta_info["output_token_logprobs"]]
    return sum(logprobs) / len(logprobs) if logprobs else float("-inf")


def run_example(backend, max_new_tokens: int = 48) -> rg.ProgramState:
    state = best_of_drafts.run(stub=STUB, draft_tokens=max_new_tokens, backend=backend)
    for index, draft in enumerate(state["draft"]):
        print(
            f"draft {index + 1}: mean logprob {state['mean_logprobs'][index]:.3f}, "
            f"{state['cached_tokens'][index]} prompt tokens from cache"
        )
        print(STUB + draft + "\n")
    print(f"best: draft {state['best'] + 1}\n{state.text()}")
    return state


def main() -> None:
    run_main(run_example, __doc__, max_new_tokens=48)


if __name__ == "__main__":
    main()
