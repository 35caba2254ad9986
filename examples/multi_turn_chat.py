"""Multi-turn chat: each turn extends the same conversation, so the runtime's radix cache
holds every earlier turn and only the new message is prefilled.

    python examples/multi_turn_chat.py [--model-path DIR | --url URL] [--max-new-tokens N]

The embedded `tiny` model is a code model, not a chat model: its replies are not meaningful
(the caching is); use --model-path with a chat model.
"""

from __future__ import annotations

from example_utils import run_main

import radixgen as rg

TURNS = [
    "Hi! I am planning a trip to Japan.",
    "What should I pack for autumn?",
    "And which city should I visit first?",
]


@rg.function
def chat(s, turns, reply_tokens):
    with s.system():
        s += "You are a friendly travel assistant."
    for index, message in enumerate(turns):
        with s.user():
            s += message
        with s.assistant():
            s += rg.gen(f"reply_{index}", max_tokens=reply_tokens)


def run_example(backend, max_new_tokens: int = 32) -> rg.ProgramState:
    state = chat.run(turns=TURNS, reply_tokens=max_new_tokens, temperature=0.7, backend=backend)
    for message in state.messages():
        print(f"[{message['role']}] {message['content']!r}")
    for index in range(len(TURNS)):
        meta = state.get_meta_info(f"reply_{index}")
        print(
            f"turn {index}: {meta['prompt_tokens']} prompt tokens, "
            f"{meta['cached_tokens']} of them from the cache"
        )
    return state


def main() -> None:
    run_main(run_example, __doc__, max_new_tokens=32)


if __name__ == "__main__":
    main()
