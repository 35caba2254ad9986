"""`GrammarHook`: the scheduler's one point of contact with `radixgen.constrained`.

A constrained request (regex, json_schema or choices) waits in the queue until its grammar
is compiled (compilation runs off the scheduler thread); then each step its matcher fills
the request's row of a packed vocab bitmask, which the sampler applies, and it advances on
every sampled token. A failed or timed-out compile fails that request alone.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from radixgen.runtime.req import Req


class GrammarHook:
    def __init__(self, tokenizer: Any, vocab_size: int, compile_timeout_s: float):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.compile_timeout_s = compile_timeout_s
        self._backend = None  # created on the first constrained request
        self._pending: dict[int, tuple[Any, float]] = {}  # id(req) -> (future, started_s)

    def _get_backend(self):
        if self._backend is None:
            from radixgen.constrained import GrammarBackend

            self._backend = GrammarBackend(self.tokenizer, vocab_size=self.vocab_size)
        return self._backend

    def start_compile(self, req: Req) -> str | None:
        """Starts compiling req's constraint. Returns an error message, or None."""
        params = req.sampling_params
        try:
            backend = self._get_backend()
            future = backend.compile_async(
                regex=params.regex, json_schema=params.json_schema, choices=params.choices
            )
        except ImportError:
            return "constrained decoding (regex / json_schema / choices) is not available"
        except (ValueError, TypeError) as error:
            return f"invalid constraint: {error}"
        self._pending[id(req)] = (future, time.monotonic())
        return None

    def poll(self, req: Req) -> tuple[bool, str | None]:
        """(ready, error). When ready without error, `req.grammar` holds a fresh matcher."""
        entry = self._pending.get(id(req))
        if entry is None:
            return True, None
        future, started_s = entry
        if not future.done():
            if time.monotonic() - started_s > self.compile_timeout_s:
                future.cancel()
                del self._pending[id(req)]
                return True, f"constraint compile timed out after {self.compile_timeout_s} s"
            return False, None
        del self._pending[id(req)]
        try:
            compiled = future.result()
        except Exception as error:  # any compile failure fails this request alone
            return True, f"invalid constraint: {error}"
        req.grammar = compiled.new_matcher()
        # A resumed request replays its output through the fresh matcher.
        for token_id in req.output_ids:
            req.grammar.accept_token(token_id)
        return True, None

    def forget(self, req: Req) -> None:
        entry = self._pending.pop(id(req), None)
        if entry is not None:
            entry[0].cancel()

    def fill_bitmask(self, reqs: list[Req], device: torch.device) -> torch.Tensor | None:
        """Packed allowed-token bits for this step's rows, or None if no row is constrained."""
        if not any(req.grammar is not None for req in reqs):
            return None
        num_words = (self.vocab_size + 31) // 32
        bitmask = torch.full((len(reqs), num_words), -1, dtype=torch.int32)  # all allowed
        for row, req in enumerate(reqs):
            if req.grammar is not None:
                req.grammar.fill_bitmask(bitmask, row)
        return bitmask.to(device, non_blocking=True)

    def accept(self, req: Req, token_id: int) -> None:
        if req.grammar is not None:
            req.grammar.accept_token(token_id)
