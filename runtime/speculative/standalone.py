"""STANDALONE drafts: a second, smaller model with its own KV memory drafts greedily.

The draft model runs on its own `ModelRunner` (its own request rows, slots and attention
backend; no radix cache: a request's prompt is computed once by the draft when it first
speculates). Per request the proposer keeps a `DraftKV`: its draft row and how many of the
request's tokens have draft KV. A step drafts K tokens with one extend forward that catches
up on the tokens the draft has not seen (the new prompt, or the last verify step's tokens)
and gives d_1, then K - 1 decode forwards, each request only while its limit lasts. After
verification the draft keeps the KV of the accepted drafts and frees the rest.

The drafts are the draft model's argmax: a deterministic draft, so the target's rejection
sampling (`verify.py`) keeps the target distribution whatever the draft model is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from radixgen.runtime.forward_batch import ForwardMode
from radixgen.runtime.req import Req
from radixgen.runtime.speculative.draft_rows import DraftRows


@dataclass
class DraftKV:
    """A request's state in the draft model's memory."""

    req: Req  # the request (guards against a reused id())
    row: int  # its row of the draft's req_to_token
    committed_len: int = 0  # tokens of req.fill_ids with draft KV (positions 0..len-1)
    written_len: int = 0  # positions with a draft slot (committed, then this step's drafts)


class DraftModelProposer:
    """Args:
    draft_runner: the draft model's `ModelRunner` (same vocabulary as the target).

    Raises:
        ValueError: the draft's vocabulary differs from `target_vocab_size`.
    """

    uses_target_hidden_states = False

    def __init__(self, draft_runner, *, target_vocab_size: int):
        if draft_runner.vocab_size != target_vocab_size:
            raise ValueError(
                f"speculative_draft_model_path: the draft model's vocabulary has "
                f"{draft_runner.vocab_size} tokens, the target's {target_vocab_size}"
            )
        self.runner = draft_runner
        self.rows: DraftRows[DraftKV] = DraftRows(
            self.runner.req_to_token_pool, self.runner.slot_allocator
        )

    @classmethod
    def from_target(cls, target_runner, draft_model_path: str) -> DraftModelProposer:
        """A draft runner on the target's device and dtype, with as many KV slots and rows
        as the target's (a smaller model: far fewer bytes)."""
        from radixgen.runtime.model_runner import ModelRunner  # the runner imports us lazily

        target_args = target_runner.server_args
        draft_args = dataclasses.replace(
            target_args,
            model_path=draft_model_path,
            tokenizer_path=None,
            load_format="auto",
            quantization=None,
            context_length=target_runner.context_length,
            max_total_tokens=target_runner.max_total_num_tokens,
            max_running_requests=target_runner.max_running_requests,
            speculative_algorithm=None,
            speculative_draft_model_path=None,
            speculative_num_steps=None,
            speculative_num_draft_tokens=None,
            speculative_eagle_topk=None,
            speculative_max_batch_size=None,
            speculative_min_accept_length=None,
            # The draft drafts with its own weights: the target's adapters verify.
            lora_paths=(),
            lora_target_modules=None,
        )
        return cls(ModelRunner(draft_args), target_vocab_size=target_runner.vocab_size)

    # ---- the DraftProposer interface -----------------------------------------------------

    def propose(self, reqs: list[Req], limits: list[int]) -> list[list[int]]:
        self.release(reqs)
        active = [(req, limit) for req, limit in zip(reqs, limits, strict=True) if limit > 0]
        drafts: dict[int, list[int]] = {id(req): [] for req in reqs}
        if active and self._reserve(active):
            drafts.update(self._draft(active))
        return [drafts[id(req)] for req in reqs]

    def after_verify(
        self, reqs: list[Req], drafts: list[list[int]], hidden_states: torch.Tensor | None
    ) -> None:
        """Keeps the draft KV of the inputs that turned out right: the old tokens, the last
        token and the accepted drafts the draft model was fed (all but its last draft)."""
        for req, draft in zip(reqs, drafts, strict=True):
            state = self.rows.states.get(id(req))
            if state is None or not draft:
                continue
            if req.finished:
                self.rows.free(state)
                continue
            first_draft_pos = state.written_len - (len(draft) - 1)  # position of d_1
            # d_i sits at first_draft_pos + i - 1 in both sequences: compare what followed.
            fill = req.fill_slice(first_draft_pos, state.written_len)
            matched = 0
            while matched < len(fill) and fill[matched] == draft[matched]:
                matched += 1
            self.rows.truncate(state, first_draft_pos + matched)

    def release(self, reqs: list[Req]) -> None:
        self.rows.release(reqs)

    def check_integrity(self) -> None:
        """Every draft slot is free or held by exactly one tracked request."""
        held = self.rows.held_slots()
        free = self.runner.slot_allocator.available_size()
        assert free + held == self.runner.max_total_num_tokens, (
            f"draft KV leak: free {free} + held {held} != {self.runner.max_total_num_tokens}"
        )

    # ---- draft memory ----------------------------------------------------------------------

    def _reserve(self, active: list[tuple[Req, int]]) -> bool:
        """Rows for new requests, and False when the draft pool cannot take this step."""
        needed = 0
        for req, limit in active:
            state = self.rows.states.get(id(req))
            if state is None:
                rows = self.runner.req_to_token_pool.alloc(1)
                if rows is None:
                    return False
                state = self.rows.states[id(req)] = DraftKV(req=req, row=rows[0])
            needed += req.seqlen - state.committed_len + limit - 1
        return self.runner.slot_allocator.available_size() >= needed

    def _draft(self, active: list[tuple[Req, int]]) -> dict[int, list[int]]:
        """Greedy drafts: a catch-up extend giving d_1, then decode steps for d_2..d_limit,
        each request only while its limit lasts."""
        states = [self.rows.states[id(req)] for req, _ in active]
        catch_up = [
            req.fill_slice(state.committed_len, req.seqlen)
            for (req, _), state in zip(active, states, strict=True)
        ]
        drafts: dict[int, list[int]] = {id(req): [] for req, _ in active}
        rows = list(range(len(active)))  # the rows of `active` in this forward
        next_ids = self._forward(ForwardMode.EXTEND, states, catch_up)
        for step in range(max(limit for _, limit in active)):
            for row, token_id in zip(rows, next_ids.tolist(), strict=True):  # host sync
                drafts[id(active[row][0])].append(token_id)
            decoding = [i for i, row in enumerate(rows) if active[row][1] > step + 1]
            if not decoding:
                break
            inputs = [[drafts[id(active[rows[i]][0])][-1]] for i in decoding]
            rows = [rows[i] for i in decoding]
            next_ids = self._forward(ForwardMode.DECODE, [states[row] for row in rows], inputs)
        return drafts

    def _forward(
        self, mode: ForwardMode, states: list[DraftKV], input_ids: list[list[int]]
    ) -> torch.Tensor:
        """One draft forward appending `input_ids[i]` to state i; returns the argmax of each
        row's last logits ([batch] int64)."""
        counts = [len(ids) for ids in input_ids]
        slots = self.runner.slot_allocator.alloc(sum(counts))
        assert slots is not None, "draft slots were reserved"
        batch = self.runner.build_forward_batch(
            mode=mode,
            input_ids=input_ids,
            req_pool_indices=[s.row for s in states],
            prefix_lens=[s.written_len for s in states],
            out_cache_loc=slots,
        )
        for state, count in zip(states, counts, strict=True):
            state.written_len += count
        if mode == ForwardMode.EXTEND:
            for state in states:
                state.committed_len = state.written_len  # the real tokens (catch-up)
        return self.runner.forward(batch).argmax(dim=-1)
