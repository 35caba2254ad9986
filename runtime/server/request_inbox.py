"""`RequestInbox`: one request's outputs on their way from the tokenizer manager's receive loop
to the handler streaming them.

The receive loop only appends each step's row (no object per output) and wakes the handler.
Rows that pile up while the handler is busy (sending the previous chunk, or the HTTP process
falling behind a fast scheduler) are merged per sample when it next takes them, so a loaded
server sends one chunk per few steps instead of one per token, and its per-chunk work (JSON,
SSE framing, socket writes) stops growing with the step rate.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from radixgen.runtime.io_struct import ReqOutput
from radixgen.runtime.server.errors import RequestError
from radixgen.runtime.server.messages import StepOutputs, merge_outputs


@dataclass
class StreamEvent:
    """One output of one sample (possibly several steps merged) plus its new text."""

    output: ReqOutput
    text_delta: str


class RequestInbox:
    """Outputs and failures of one request, for its one consumer (`take`)."""

    def __init__(self):
        self.created_s = time.perf_counter()
        self.first_token_s: float | None = None
        self._rows: list[tuple[StepOutputs, int, str]] = []  # (step, row, text delta)
        self._error: RequestError | None = None
        self._ready = asyncio.Event()

    def put_row(self, step: StepOutputs, row: int, text_delta: str) -> None:
        self._rows.append((step, row, text_delta))
        self._ready.set()

    def put_error(self, error: RequestError) -> None:
        """Ends the request: `take` raises `error` once the outputs before it are taken."""
        if self._error is None:
            self._error = error
        self._ready.set()

    async def take(self) -> list[StreamEvent]:
        """Waits for outputs; returns what arrived since the last call, one merged event per
        sample (in arrival order).

        Raises:
            RequestError: the request was ended (`put_error`) and no output is left.
        """
        await self._ready.wait()
        rows, self._rows = self._rows, []
        if self._error is None or rows:
            if self._error is None:
                self._ready.clear()
            return _merge_by_sample(rows)
        raise self._error


def _merge_by_sample(rows: list[tuple[StepOutputs, int, str]]) -> list[StreamEvent]:
    if len(rows) == 1:
        step, row, text_delta = rows[0]
        return [StreamEvent(step.output(row), text_delta)]
    by_sample: dict[int, list[tuple[ReqOutput, str]]] = {}
    for step, row, text_delta in rows:
        output = step.output(row)
        by_sample.setdefault(output.index, []).append((output, text_delta))
    return [
        StreamEvent(
            merge_outputs([output for output, _ in parts]), "".join(delta for _, delta in parts)
        )
        for parts in by_sample.values()
    ]
