"""Shared command line for the examples: pick the model (or a running server) and open it.

python examples/<name>.py                       # the embedded `tiny` code model
python examples/<name>.py --model-path DIR      # a local HF checkpoint folder
python examples/<name>.py --url http://127.0.0.1:30000   # a running `radixgen serve`
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import radixgen as rg


def parse_args(description: str, max_new_tokens: int) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model-path", default="tiny", help="'tiny' or a local HF folder")
    parser.add_argument("--url", default=None, help="use a running radixgen server instead")
    parser.add_argument("--api-key", default=None, help="the server's --api-key, if any")
    parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    return parser.parse_args()


@contextmanager
def open_backend(args: argparse.Namespace) -> Iterator[object]:
    """An in-process Engine (shut down afterwards), or a RuntimeEndpoint for --url."""
    if args.url:
        backend = rg.RuntimeEndpoint(args.url, api_key=args.api_key)
        try:
            yield backend
        finally:
            backend.close()
        return
    with rg.Engine(model_path=args.model_path) as engine:
        yield engine


def run_main(run_example: Callable[..., object], doc: str, max_new_tokens: int) -> None:
    """The `main()` of every example: parse the command line, open the backend, run."""
    args = parse_args(doc.strip().splitlines()[0], max_new_tokens)
    with open_backend(args) as backend:
        run_example(backend, args.max_new_tokens)
