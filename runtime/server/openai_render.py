"""Rendering radixgen outputs as OpenAI responses and stream chunks (completions and chat).

A renderer lives for one HTTP request: while streaming, it remembers which choices already
announced their role and the token counts that the final usage chunk reports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from radixgen.runtime.io_struct import ReqOutput, TokenLogprob
from radixgen.runtime.server.openai_protocol import (
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    ChatResponseMessage,
    ChatStreamChoice,
    ChatTokenLogprob,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    MessageToolCall,
    PromptTokensDetails,
    ResponseToolCall,
    TopLogprob,
    UsageInfo,
)
from radixgen.runtime.server.openai_tools import ToolCallStream, ToolPlan, tool_call_dicts
from radixgen.runtime.server.streaming import SampleResult
from radixgen.runtime.server.tokenizer_manager import StreamEvent

# No logprob (the very first prompt token) is reported to OpenAI clients as this floor.
MISSING_LOGPROB = -9999.0


def finish_reason_name(finish_reason: dict[str, Any] | None, called: bool = False) -> str | None:
    """radixgen's finish-reason dict -> OpenAI's string ("stop" or "length"; "tool_calls"
    when the output ended after calling tools)."""
    if finish_reason is None:
        return None
    if finish_reason.get("type") == "length":
        return "length"
    return "tool_calls" if called else "stop"


def _tool_calls(calls, first_index: int = 0, *, streamed: bool) -> list[MessageToolCall] | None:
    if not calls:
        return None
    entries = tool_call_dicts(calls, first_index)
    if streamed:
        return [ResponseToolCall(**entry) for entry in entries]
    return [
        MessageToolCall(**{k: v for k, v in entry.items() if k != "index"}) for entry in entries
    ]


@dataclass
class _UsageTally:
    """Token counts per prompt (counted once, whatever `n`) and per choice."""

    prompt_tokens: dict[int, int] = field(default_factory=dict)
    cached_tokens: dict[int, int] = field(default_factory=dict)
    completion_tokens: dict[int, int] = field(default_factory=dict)

    def record(self, prompt_index: int, choice_index: int, sample) -> None:
        self.prompt_tokens[prompt_index] = sample.prompt_tokens
        self.cached_tokens[prompt_index] = sample.cached_tokens
        self.completion_tokens[choice_index] = sample.completion_tokens

    def usage(self) -> UsageInfo:
        prompt_tokens = sum(self.prompt_tokens.values())
        completion_tokens = sum(self.completion_tokens.values())
        return UsageInfo(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(
                cached_tokens=sum(self.cached_tokens.values())
            ),
        )


@dataclass
class _Renderer:
    response_id: str
    model: str
    decode_token: Callable[[int], str]
    num_samples: int = 1
    tally: _UsageTally = field(default_factory=_UsageTally)

    def _choice_index(self, prompt_index: int, sample_index: int) -> int:
        return prompt_index * self.num_samples + sample_index

    def _token_text(self, entry: TokenLogprob) -> tuple[str, float]:
        logprob, token_id = entry
        return self.decode_token(token_id), MISSING_LOGPROB if logprob is None else logprob


class CompletionRenderer(_Renderer):
    def _logprobs(
        self, token_logprobs: list[TokenLogprob], top_logprobs: list | None, offset: int
    ) -> CompletionLogprobs:
        result = CompletionLogprobs()
        for position, entry in enumerate(token_logprobs):
            token, logprob = self._token_text(entry)
            result.tokens.append(token)
            result.token_logprobs.append(logprob)
            result.text_offset.append(offset)
            offset += len(token)
            alternatives = top_logprobs[position] if top_logprobs else None
            result.top_logprobs.append(
                dict(self._token_text(alt) for alt in alternatives) if alternatives else None
            )
        return result

    def stream_chunks(self, item: tuple[int, StreamEvent]) -> Iterator[dict]:
        prompt_index, event = item
        output: ReqOutput = event.output
        self.tally.record(prompt_index, self._choice_index(prompt_index, output.index), output)
        if not (event.text_delta or output.finished or output.output_token_logprobs):
            return
        logprobs = None
        if output.output_token_logprobs:
            logprobs = self._logprobs(output.output_token_logprobs, output.output_top_logprobs, 0)
        choice = CompletionChoice(
            index=self._choice_index(prompt_index, output.index),
            text=event.text_delta,
            logprobs=logprobs,
            finish_reason=finish_reason_name(output.finish_reason) if output.finished else None,
        )
        chunk = CompletionResponse(id=self.response_id, model=self.model, choices=[choice])
        yield chunk.model_dump()

    def usage_chunks(self, include_usage: bool) -> Iterator[dict]:
        """The final usage-only chunk that `stream_options.include_usage` asks for."""
        if include_usage:
            chunk = CompletionResponse(
                id=self.response_id, model=self.model, choices=[], usage=self.tally.usage()
            )
            yield chunk.model_dump()

    def response(self, results: list[list[SampleResult]]) -> dict:
        choices = []
        for prompt_index, samples in enumerate(results):
            for sample in samples:
                index = self._choice_index(prompt_index, sample.index)
                self.tally.record(prompt_index, index, sample)
                logprobs = None
                if sample.output_token_logprobs:
                    logprobs = self._logprobs(
                        sample.output_token_logprobs, sample.output_top_logprobs, 0
                    )
                choices.append(
                    CompletionChoice(
                        index=index,
                        text=sample.text,
                        logprobs=logprobs,
                        finish_reason=finish_reason_name(sample.finish_reason),
                    )
                )
        return CompletionResponse(
            id=self.response_id, model=self.model, choices=choices, usage=self.tally.usage()
        ).model_dump()


@dataclass
class ChatRenderer(_Renderer):
    announced: set[int] = field(default_factory=set)  # choices whose role chunk went out
    tool_plan: ToolPlan | None = None  # the request's tools: outputs are read for calls
    tool_streams: dict[int, ToolCallStream] = field(default_factory=dict)  # per choice

    def _logprobs(self, token_logprobs: list[TokenLogprob], top_logprobs: list | None):
        content = []
        for position, entry in enumerate(token_logprobs):
            token, logprob = self._token_text(entry)
            alternatives = top_logprobs[position] if top_logprobs else None
            top = []
            for alternative in alternatives or ():
                alt_token, alt_logprob = self._token_text(alternative)
                top.append(
                    TopLogprob(token=alt_token, logprob=alt_logprob, bytes=list(alt_token.encode()))
                )
            content.append(
                ChatTokenLogprob(
                    token=token, logprob=logprob, bytes=list(token.encode()), top_logprobs=top
                )
            )
        return ChatLogprobs(content=content)

    def _chunk(self, choice: ChatStreamChoice) -> dict:
        return ChatCompletionChunk(
            id=self.response_id, model=self.model, choices=[choice]
        ).model_dump()

    def stream_chunks(self, item: tuple[int, StreamEvent]) -> Iterator[dict]:
        _, event = item
        output: ReqOutput = event.output
        index = output.index
        self.tally.record(0, index, output)
        if index not in self.announced:
            # OpenAI's first chunk of each choice carries only the role.
            self.announced.add(index)
            yield self._chunk(
                ChatStreamChoice(index=index, delta=ChatDelta(role="assistant", content=""))
            )
        if not (event.text_delta or output.finished or output.output_token_logprobs):
            return
        logprobs = None
        if output.output_token_logprobs:
            logprobs = self._logprobs(output.output_token_logprobs, output.output_top_logprobs)
        content, calls, called, first_index = event.text_delta, [], False, 0
        if self.tool_plan is not None:
            stream = self.tool_streams.setdefault(index, ToolCallStream(self.tool_plan))
            first_index = stream.calls_sent
            content, calls = stream.feed(event.text_delta)
            if output.finished:
                rest, more_calls = stream.finish()
                content, calls = content + rest, calls + more_calls
            called = bool(stream.sent)
            if not (content or calls or output.finished or logprobs):
                return
        yield self._chunk(
            ChatStreamChoice(
                index=index,
                delta=ChatDelta(
                    content=content or None,
                    tool_calls=_tool_calls(calls, first_index if calls else 0, streamed=True),
                ),
                logprobs=logprobs,
                finish_reason=(
                    finish_reason_name(output.finish_reason, called) if output.finished else None
                ),
            )
        )

    def usage_chunks(self, include_usage: bool) -> Iterator[dict]:
        if include_usage:
            chunk = ChatCompletionChunk(
                id=self.response_id, model=self.model, choices=[], usage=self.tally.usage()
            )
            yield chunk.model_dump()

    def response(self, samples: list[SampleResult]) -> dict:
        choices = []
        for sample in samples:
            self.tally.record(0, sample.index, sample)
            logprobs = None
            if sample.output_token_logprobs:
                logprobs = self._logprobs(sample.output_token_logprobs, sample.output_top_logprobs)
            content, calls = sample.text, []
            if self.tool_plan is not None:
                parsed = self.tool_plan.parse(sample.text)
                content, calls = parsed.content, parsed.tool_calls
                if calls and not content.strip():
                    content = None  # OpenAI's null content beside tool calls
            choices.append(
                ChatCompletionChoice(
                    index=sample.index,
                    message=ChatResponseMessage(
                        content=content, tool_calls=_tool_calls(calls, streamed=False)
                    ),
                    logprobs=logprobs,
                    finish_reason=finish_reason_name(sample.finish_reason, bool(calls)),
                )
            )
        return ChatCompletionResponse(
            id=self.response_id, model=self.model, choices=choices, usage=self.tally.usage()
        ).model_dump()
