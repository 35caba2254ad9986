"""`OutputAccumulator`: folds one sample's `ReqOutput`s into the Engine's result dict.

Result dict (SGLang's shape):
    {"text", "output_ids", "index", "meta_info": {"id", "prompt_tokens",
     "completion_tokens", "cached_tokens", "finish_reason", and with return_logprob:
     "input_token_logprobs", "output_token_logprobs" (lists of (logprob, token_id)),
     "input_top_logprobs", "output_top_logprobs" (when top_logprobs_num > 0)}}
"""

from __future__ import annotations

from typing import Any

from radixgen.runtime.detokenizer import IncrementalDetokenizer
from radixgen.runtime.io_struct import ReqOutput


class OutputAccumulator:
    def __init__(
        self,
        *,
        rid: str,
        index: int,
        tokenizer: Any,
        prompt_ids: list[int],
        skip_special_tokens: bool,
        stop_strings: list[str],
        return_logprob: bool,
        top_logprobs_num: int,
        stream: bool = True,
    ):
        self.rid = rid
        self.index = index
        self.detokenizer = IncrementalDetokenizer(
            tokenizer,
            prompt_ids,
            skip_special_tokens=skip_special_tokens,
            stop_strings=stop_strings,
        )
        # Without streaming nobody reads the deltas: the text is decoded once, at the end.
        # Decoding every token as it arrives costs two tokenizer calls per token on the
        # caller's thread, which competes for the GIL with the scheduler thread.
        self.stream = stream
        self.undecoded_ids: list[int] = []
        self.return_logprob = return_logprob
        self.top_logprobs_num = top_logprobs_num
        self.output_ids: list[int] = []
        self.finished = False
        self.last: ReqOutput | None = None
        self.input_token_logprobs: list = []
        self.input_top_logprobs: list = []
        self.output_token_logprobs: list = []
        self.output_top_logprobs: list = []

    def add(self, output: ReqOutput) -> str:
        """Folds in one output; returns the newly decoded text (the stream delta; always ""
        without streaming until the output finishes)."""
        self.output_ids += output.new_token_ids
        self.finished = output.finished
        self.last = output
        if output.input_token_logprobs is not None:
            self.input_token_logprobs = list(output.input_token_logprobs)
            self.input_top_logprobs = list(output.input_top_logprobs or [])
        self.output_token_logprobs += output.output_token_logprobs or []
        self.output_top_logprobs += output.output_top_logprobs or []
        if self.stream:
            return self.detokenizer.add_tokens(output.new_token_ids, finished=output.finished)
        self.undecoded_ids += output.new_token_ids
        if not output.finished:
            return ""
        new_ids, self.undecoded_ids = self.undecoded_ids, []
        return self.detokenizer.add_tokens(new_ids, finished=True)

    @property
    def text(self) -> str:
        return self.detokenizer.text

    def result(self) -> dict[str, Any]:
        last = self.last
        meta: dict[str, Any] = {
            "id": self.rid,
            "prompt_tokens": last.prompt_tokens if last else 0,
            "completion_tokens": last.completion_tokens if last else 0,
            "cached_tokens": last.cached_tokens if last else 0,
            "finish_reason": last.finish_reason if last and self.finished else None,
        }
        if self.return_logprob:
            meta["input_token_logprobs"] = self.input_token_logprobs
            meta["output_token_logprobs"] = self.output_token_logprobs
            if self.top_logprobs_num:
                meta["input_top_logprobs"] = self.input_top_logprobs
                meta["output_top_logprobs"] = self.output_top_logprobs
        return {
            "text": self.text,
            "output_ids": list(self.output_ids),
            "index": self.index,
            "meta_info": meta,
        }
