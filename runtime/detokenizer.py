"""Incremental detokenization that never emits a broken character, with stop strings trimmed.

Byte-level BPE splits multi-byte UTF-8 characters across tokens; decoding a prefix of such a
split yields U+FFFD. We decode a short window of recent tokens and hold back a trailing
U+FFFD until the following tokens complete it (an invalid byte stays U+FFFD for good and is
emitted once text follows it). Text that could be the start of a
stop string is also held back, so streamed text is never retracted when the stop string
completes; once a stop string appears, the text is cut right before it.

Used by the Engine (per request), the server's detokenizer process, and the scheduler (to
detect stop strings that span token boundaries).
"""

from __future__ import annotations

from typing import Any

REPLACEMENT_CHAR = "\ufffd"
# Prompt tokens decoded ahead of the output, so tokenizers that drop a leading space when a
# sequence starts (SentencePiece) decode the first output token as in context.
PROMPT_CONTEXT_TOKENS = 4


def find_stop(text: str, stop_strings: list[str], start: int = 0) -> tuple[int, str] | None:
    """Earliest (position, stop string) with position >= start, or None."""
    best = None
    for stop in stop_strings:
        position = text.find(stop, start)
        if position != -1 and (best is None or position < best[0]):
            best = (position, stop)
    return best


def partial_stop_suffix_len(text: str, stop_strings: list[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
    longest = 0
    for stop in stop_strings:
        for length in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:length]):
                longest = length
                break
    return longest


class IncrementalDetokenizer:
    """Turns a growing list of output token ids into text deltas.

    Args:
        tokenizer: a HF tokenizer (anything with `decode(ids, skip_special_tokens=...)`).
        prompt_ids: the prompt, for decoding context (only its last few tokens are used).
        skip_special_tokens: drop special tokens from the text.
        stop_strings: generation text ends right before the first of these.
    """

    def __init__(
        self,
        tokenizer: Any,
        prompt_ids: list[int] | None = None,
        *,
        skip_special_tokens: bool = True,
        stop_strings: list[str] | None = None,
    ):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stop_strings = list(stop_strings or [])
        context = list(prompt_ids or [])[-PROMPT_CONTEXT_TOKENS:]
        self.ids: list[int] = context
        # ids[prefix_offset:read_offset] is the window already turned into text; decoding
        # from prefix_offset keeps word-boundary spaces right.
        self.prefix_offset = 0
        self.read_offset = len(context)
        self.decoded_text = ""  # all output text decoded so far (stop strings not trimmed)
        # Text of the open window (ids[read_offset:]) already added to decoded_text.
        self.window_decoded_len = 0
        self.emitted_len = 0  # how much of the output text was handed out
        self.stopped_at: int | None = None  # text position of the matched stop string
        self.matched_stop: str | None = None

    @property
    def text(self) -> str:
        """The output text handed out so far."""
        return self.decoded_text[: self.emitted_len]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add_tokens(self, new_ids: list[int], finished: bool = False) -> str:
        """Appends output tokens; returns the text newly safe to emit.

        When `finished`, everything left is flushed (a dangling partial character included).
        After a stop string has matched, further tokens add no text.
        """
        if self.stopped_at is None:
            self.ids.extend(new_ids)
            prefix_ids, window_ids = self._open_windows()
            self._take_decoded(self._decode(prefix_ids), self._decode(window_ids), finished)
        return self._emit(finished)

    def _open_windows(self) -> tuple[list[int], list[int]]:
        """The two id windows whose decoded texts differ by the new text."""
        return self.ids[self.prefix_offset : self.read_offset], self.ids[self.prefix_offset :]

    def _take_decoded(self, prefix_text: str, window_text: str, flush: bool) -> None:
        """Adds the new text (the window's text past the prefix's), then looks for a stop."""
        self._add_new_text(prefix_text, window_text, flush)
        stop_search_start = max(0, self.emitted_len - self._max_stop_len())
        match = find_stop(self.decoded_text, self.stop_strings, stop_search_start)
        if match is not None:
            self.stopped_at, self.matched_stop = match

    def _add_new_text(self, prefix_text: str, window_text: str, flush: bool) -> None:
        new_text = window_text[len(prefix_text) :]
        if new_text.endswith(REPLACEMENT_CHAR) and not flush:
            # Only the last U+FFFD can still become a character (UTF-8 decoding replaces an
            # incomplete tail with exactly one U+FFFD; earlier ones are invalid bytes for
            # good): keep the text before it, and this window open for the missing bytes.
            stable = new_text[:-1]
            self.decoded_text += stable[self.window_decoded_len :]
            self.window_decoded_len = max(self.window_decoded_len, len(stable))
            return
        self.decoded_text += new_text[self.window_decoded_len :]
        self.window_decoded_len = 0
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)

    def _emit(self, finished: bool) -> str:
        if self.stopped_at is not None:
            safe_len = self.stopped_at
        elif finished:
            safe_len = len(self.decoded_text)
        else:
            held = partial_stop_suffix_len(self.decoded_text, self.stop_strings)
            safe_len = len(self.decoded_text) - held
        if safe_len <= self.emitted_len:
            return ""
        delta = self.decoded_text[self.emitted_len : safe_len]
        self.emitted_len = safe_len
        return delta

    def _max_stop_len(self) -> int:
        return max((len(s) for s in self.stop_strings), default=0)


def add_tokens_batch(
    tokenizer: Any,
    streams: list[IncrementalDetokenizer],
    new_ids: list[list[int]],
    finished: list[bool],
) -> list[str]:
    """`streams[i].add_tokens(new_ids[i], finished[i])` for every i (streams built on
    `tokenizer`), with the decodes in one batched call per `skip_special_tokens` value: the
    server's detokenizer makes one call per scheduler step instead of two per request (3.5 us
    against 9.7 us a sequence, measured with the tiny tokenizer on the CPU)."""
    seen: set[int] = set()
    for cut, stream in enumerate(streams):
        if id(stream) in seen:  # one stream twice (two steps' outputs): in order, not at once
            head = add_tokens_batch(tokenizer, streams[:cut], new_ids[:cut], finished[:cut])
            tail = add_tokens_batch(tokenizer, streams[cut:], new_ids[cut:], finished[cut:])
            return head + tail
        seen.add(id(stream))
    active = [i for i, stream in enumerate(streams) if stream.stopped_at is None]
    windows: dict[bool, list[list[int]]] = {True: [], False: []}
    for i in active:
        streams[i].ids.extend(new_ids[i])
        windows[streams[i].skip_special_tokens].extend(streams[i]._open_windows())
    texts = {
        skip: iter(decode_batch(tokenizer, sequences, skip))
        for skip, sequences in windows.items()
        if sequences
    }
    for i in active:
        decoded = texts[streams[i].skip_special_tokens]
        streams[i]._take_decoded(next(decoded), next(decoded), finished[i])
    return [stream._emit(done) for stream, done in zip(streams, finished, strict=True)]


def decode_batch(
    tokenizer: Any, sequences: list[list[int]], skip_special_tokens: bool
) -> list[str]:
    """`[tokenizer.decode(s, skip_special_tokens=...) for s in sequences]`, in one call to a
    HF fast tokenizer's Rust backend where that is the same thing (no clean-up pass)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return backend.decode_batch(sequences, skip_special_tokens=skip_special_tokens)
    return [tokenizer.decode(s, skip_special_tokens=skip_special_tokens) for s in sequences]
