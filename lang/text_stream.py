"""`TextStream`: the append-only log of text a program state produces, for streaming.

The executor appends chunks as they arrive (constant text, role markers, generated
deltas); any number of readers iterate the log from the start, blocking (or awaiting)
until more arrives or the program ends. Reading never consumes, so `text_iter()` can be
called several times and always yields the same sequence.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from enum import Enum


class ChunkKind(Enum):
    TEXT = "text"  # appended text; `var_name` says which gen produced it (None: constant)
    VAR_END = "var_end"  # the gen/select named `var_name` finished


@dataclass(frozen=True)
class StreamChunk:
    kind: ChunkKind
    text: str
    var_name: str | None


class TextStream:
    def __init__(self, chunks: list[StreamChunk] | None = None):
        self._chunks: list[StreamChunk] = list(chunks or [])
        self._closed = False
        self._error: BaseException | None = None
        self._changed = threading.Condition()

    def append_text(self, text: str, var_name: str | None = None) -> None:
        if text:
            self._append(StreamChunk(ChunkKind.TEXT, text, var_name))

    def end_var(self, var_name: str) -> None:
        self._append(StreamChunk(ChunkKind.VAR_END, "", var_name))

    def _append(self, chunk: StreamChunk) -> None:
        with self._changed:
            self._chunks.append(chunk)
            self._changed.notify_all()

    def close(self, error: BaseException | None = None) -> None:
        """No more chunks will come; readers finish (raising `error` if given)."""
        with self._changed:
            self._closed = True
            self._error = error
            self._changed.notify_all()

    def snapshot(self) -> list[StreamChunk]:
        with self._changed:
            return list(self._chunks)

    def _wait_from(self, index: int) -> tuple[list[StreamChunk], bool]:
        """Chunks from `index` on (waiting for at least one unless closed), and closed?"""
        with self._changed:
            self._changed.wait_for(lambda: len(self._chunks) > index or self._closed)
            return self._chunks[index:], self._closed and len(self._chunks) == index

    def iter_text(self, var_name: str | None = None) -> Iterator[str]:
        """All text in order; or, with `var_name`, the chunks of that variable's first
        generation after the start (ending when it finishes)."""
        index = 0
        while True:
            chunks, finished = self._wait_from(index)
            if finished:
                break
            index += len(chunks)
            texts, var_done = _texts_of(chunks, var_name)
            yield from texts
            if var_done:
                return
        self._raise_if_failed()

    async def aiter_text(self, var_name: str | None = None) -> AsyncIterator[str]:
        """`iter_text` for asyncio: waiting happens in a worker thread, not on the loop."""
        index = 0
        while True:
            chunks, finished = await asyncio.to_thread(self._wait_from, index)
            if finished:
                break
            index += len(chunks)
            texts, var_done = _texts_of(chunks, var_name)
            for text in texts:
                yield text
            if var_done:
                return
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        with self._changed:
            error = self._error
        if error is not None:
            raise error


def _texts_of(chunks: list[StreamChunk], var_name: str | None) -> tuple[list[str], bool]:
    """The texts a reader wants from `chunks`, and whether the wanted variable ended."""
    texts = []
    for chunk in chunks:
        if var_name is not None and chunk.var_name != var_name:
            continue
        if chunk.kind is ChunkKind.VAR_END:
            if var_name is not None:
                return texts, True
            continue
        texts.append(chunk.text)
    return texts, False
