"""EAGLE drafts: a one-layer head on the target's last hidden states drafts a chain greedily.

The head (runtime/models/llama_eagle.py) reads pairs (f_p, x_{p+1}): the target's feature at
position p and the next token. The target's features come from its prefill forwards
(`after_prefill`: the scheduler asks the runner for them) and from the verify forwards
(`after_verify`: the decoder asks; both because `uses_target_hidden_states`): after a verify
step that appended tokens up to position n' - 1, the true features f_{n-1} .. f_{n'-2} of the
inputs that were kept wait in the request's `EagleState.pending` (after a prefill, the
prompt's). The next step feeds them to the head in one extend forward (a catch-up, with the
tokens that follow them), whose last row predicts f_{n'-1} and the first draft d_1; then
`num_steps - 1` decode forwards each feed the head its own predicted feature with the draft
before: (g, d_i) -> d_{i+1}.

The head keeps its own KV (one layer; own request rows, and as many slots as the target's up
to MAX_HEAD_SLOTS): per request, the pairs fed with true features stay (`committed_len`),
those of the drafts are freed after verification (their true features arrive as the next
`pending`). A request whose features no longer line up with its tokens (it decoded plainly in
between: a back-off step, a declined step) starts over: its next verify step carries no draft
and only collects f_{n-1}. A cached prefix has no features: the head's memory starts after it.
The head's positions count from the start of its memory (RoPE depends only on distances).

The drafts are the head's argmax: a deterministic draft, so the target's rejection sampling
(`verify.py`) keeps the target distribution.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from radixgen.radix_cache.memory_pool import ReqToTokenPool, SlotAllocator, TokenToKVPool
from radixgen.runtime.forward_batch import ForwardMode, build_forward_batch
from radixgen.runtime.loader import load_eagle_head
from radixgen.runtime.model_config import ModelConfig
from radixgen.runtime.models.llama_eagle import LlamaEagleHead, read_eagle_config
from radixgen.runtime.req import Req
from radixgen.runtime.speculative.draft_rows import DraftRows
from radixgen.runtime.tiny_model import resolve_model_path

# The head's KV slots at most (Llama-3.1-8B: 2 GiB, one layer; tiny: 256 MiB): tokens since
# each running request's first verify step, plus this step's drafts. A step that lacks them
# drafts nothing.
MAX_HEAD_SLOTS = 1 << 19


@dataclass(frozen=True)
class HeadShapes:
    """What an attention backend reads of a runner (`TritonAttentionBackend`), for the head's
    one layer: its heads are never split, also where the target's are (tensor parallelism)."""

    model_config: ModelConfig
    num_local_heads: int
    num_local_kv_heads: int
    device: torch.device


@dataclass
class EagleState:
    """A request's state in the head's memory: its row holds the pairs of feature positions
    `start .. start + committed_len - 1` (true features), then this step's drafts."""

    req: Req  # the request (guards against a reused id())
    row: int  # its row of the head's req_to_token
    start: int  # sequence position of the feature in the row's first entry
    committed_len: int = 0  # entries fed with true features
    written_len: int = 0  # entries with a slot (committed, then this step's drafts)
    # [num_pending, hidden]: true features of positions start + committed_len onwards.
    pending: list[torch.Tensor] = field(default_factory=list)

    @property
    def num_pending(self) -> int:
        return sum(len(features) for features in self.pending)

    def lines_up(self) -> bool:
        """Whether the pending features end right before the request's last token (no plain
        step or declined verify came in between)."""
        return self.start + self.committed_len + self.num_pending == self.req.seqlen - 1


class EagleProposer:
    """Args:
    head: the EAGLE head, attached to the target model.
    target_runner: the target's `ModelRunner` (device, dtype, sizes, attention backend kind).
    """

    uses_target_hidden_states = True

    def __init__(self, head: LlamaEagleHead, target_runner):
        self.head = head
        config = head.config
        device = target_runner.device
        # Slot 0 is padding. Capped: the head is loaded after the target took its share of
        # GPU memory; a full pool would cost 1/num_layers of the target's KV.
        num_slots = min(target_runner.max_total_num_tokens, MAX_HEAD_SLOTS) + 1
        self.req_to_token_pool = ReqToTokenPool(
            target_runner.max_running_requests, target_runner.context_length, device=device
        )
        self.token_to_kv_pool = TokenToKVPool(
            num_slots=num_slots,
            num_layers=1,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            dtype=target_runner.dtype,
            device=device,
        )
        self.slot_allocator = SlotAllocator(num_slots, device=device)
        self.max_total_num_tokens = num_slots - 1
        # A backend of the target's kind over the head's own (never split) heads, with its own
        # per-batch metadata.
        self.attn_backend = type(target_runner.attn_backend)(
            HeadShapes(config, config.num_heads, config.num_kv_heads, device)
        )
        self.rows: DraftRows[EagleState] = DraftRows(self.req_to_token_pool, self.slot_allocator)
        self._step_seqlens: dict[int, int] = {}  # id(req) -> seqlen when this step proposed

    @classmethod
    def from_target(cls, target_runner, head_path: str) -> EagleProposer:
        """Loads the head in `head_path` (a folder, or "tiny-eagle": tiny's trained head)
        beside the target (same device and dtype)."""
        head_path = resolve_model_path(head_path)
        config = read_eagle_config(head_path, target_runner.model_config)
        head = load_eagle_head(
            head_path,
            head_config=config,
            target=target_runner.model,
            dtype=target_runner.dtype,
            device=target_runner.device,
            whole_vocabulary=target_runner.whole_vocabulary,  # under tensor parallelism
        )
        return cls(head, target_runner)

    # ---- the DraftProposer interface -----------------------------------------------------

    def propose(self, reqs: list[Req], limits: list[int]) -> list[list[int]]:
        self.release(reqs)
        self._step_seqlens = {id(req): req.seqlen for req in reqs}
        for req in reqs:
            state = self.rows.states.get(id(req))
            if state is not None and not state.lines_up():
                self.rows.free(state)  # it decoded plainly since: start over
        active = [
            (self.rows.states[id(req)], limit)
            for req, limit in zip(reqs, limits, strict=True)
            if limit > 0 and id(req) in self.rows.states and self.rows.states[id(req)].pending
        ]
        needed = sum(state.num_pending + limit - 1 for state, limit in active)
        drafts: dict[int, list[int]] = {id(req): [] for req in reqs}
        if active and self.slot_allocator.available_size() >= needed:
            drafts.update(self._draft(active))
        return [drafts[id(req)] for req in reqs]

    def after_verify(
        self, reqs: list[Req], drafts: list[list[int]], hidden_states: torch.Tensor | None
    ) -> None:
        """Keeps the true features of the inputs that were kept: request i's verify rows
        (1 + len(drafts[i]) of `hidden_states`, [num_verify_tokens, hidden]) are positions
        n - 1 onwards; rows 0 .. appended - 1 fed tokens that are now the request's."""
        assert hidden_states is not None, "EAGLE needs the verify forward's hidden states"
        first_row = 0
        for req, draft in zip(reqs, drafts, strict=True):
            rows = hidden_states[first_row : first_row + 1 + len(draft)]
            first_row += 1 + len(draft)
            state = self.rows.states.get(id(req))
            if state is not None:
                self.rows.truncate(state, state.committed_len)
            appended = req.seqlen - self._step_seqlens[id(req)]
            if req.finished or not 0 < appended <= len(rows):
                if state is not None:
                    self.rows.free(state)  # finished, or more tokens than rows (a forced run)
                continue
            if state is None:
                row = self.req_to_token_pool.alloc(1)
                if row is None:
                    continue
                # The features start at the step's first verify position, n - 1.
                start = self._step_seqlens[id(req)] - 1
                state = self.rows.states[id(req)] = EagleState(req=req, row=row[0], start=start)
            state.pending.append(rows[:appended])

    def after_prefill(self, reqs: list[Req], forward_batch, hidden_states: torch.Tensor) -> None:
        """Keeps the features of a prefill (or a chunk of one): request i's rows of
        `hidden_states` ([num_tokens, hidden]; its extend tokens come i-th) are positions
        prefix_i onwards. A request whose memory does not end right there (a new one, a
        cached prefix without features, a retracted one) starts over at prefix_i."""
        first_row = 0
        for req, prefix, count in zip(
            reqs, forward_batch.prefix_lens_cpu, forward_batch.extend_lens_cpu, strict=False
        ):
            rows = hidden_states[first_row : first_row + count]
            first_row += count
            state = self.rows.states.get(id(req))
            if state is not None and (
                state.req is not req
                or state.start + state.committed_len + state.num_pending != prefix
            ):
                self.rows.free(state)
                state = None
            if state is None:
                row = self.req_to_token_pool.alloc(1)
                if row is None:
                    continue
                state = self.rows.states[id(req)] = EagleState(req=req, row=row[0], start=prefix)
            state.pending.append(rows)

    def release(self, reqs: list[Req]) -> None:
        self.rows.release(reqs)

    def check_integrity(self) -> None:
        """Every head slot is free or held by exactly one tracked request."""
        held = self.rows.held_slots()
        free = self.slot_allocator.available_size()
        assert free + held == self.max_total_num_tokens, (
            f"EAGLE KV leak: free {free} + held {held} != {self.max_total_num_tokens}"
        )

    # ---- drafting --------------------------------------------------------------------------

    def _draft(self, active: list[tuple[EagleState, int]]) -> dict[int, list[int]]:
        """A catch-up extend over each request's pending pairs gives d_1; decode forwards on
        the head's own features give d_2 .. d_limit, each request while its limit lasts."""
        states = [state for state, _ in active]
        inputs = [
            state.req.fill_slice(state.req.seqlen - state.num_pending, state.req.seqlen)
            for state in states
        ]
        features = torch.cat([f for state in states for f in state.pending])  # [tokens, hidden]
        for state in states:
            state.pending = []
        next_ids, predicted = self._forward(ForwardMode.EXTEND, states, inputs, features)
        for state in states:
            state.committed_len = state.written_len  # true features, kept after verification
        drafts: dict[int, list[int]] = {id(state.req): [] for state in states}
        rows = list(range(len(active)))  # the rows of `active` in this forward
        for step in range(max(limit for _, limit in active)):
            for row, token_id in zip(rows, next_ids.tolist(), strict=True):  # host sync
                drafts[id(states[row].req)].append(token_id)
            decoding = [i for i, row in enumerate(rows) if active[row][1] > step + 1]
            if not decoding:
                break
            inputs = [[drafts[id(states[rows[i]].req)][-1]] for i in decoding]
            keep = torch.tensor(decoding, device=predicted.device)
            rows = [rows[i] for i in decoding]
            next_ids, predicted = self._forward(
                ForwardMode.DECODE, [states[row] for row in rows], inputs, predicted[keep]
            )
        return drafts

    def _forward(
        self,
        mode: ForwardMode,
        states: list[EagleState],
        input_ids: list[list[int]],
        features: torch.Tensor,  # [num_tokens, hidden]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One head forward appending the pairs (features, input_ids[i]) to state i; returns
        each request's argmax ([batch] int64) and predicted feature ([batch, hidden])."""
        counts = [len(ids) for ids in input_ids]
        slots = self.slot_allocator.alloc(sum(counts))
        assert slots is not None, "head slots were checked before drafting"
        batch = build_forward_batch(
            mode=mode,
            input_ids=input_ids,
            req_pool_indices=[state.row for state in states],
            prefix_lens=[state.written_len for state in states],
            out_cache_loc=slots,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.token_to_kv_pool,
            attn_backend=self.attn_backend,
        )
        for state, count in zip(states, counts, strict=True):
            state.written_len += count
        with torch.no_grad():
            self.attn_backend.init_forward_metadata(batch)
            return self.head(batch, features)
