"""`DraftRows`: the per-request rows a draft holds in its own KV memory (the STANDALONE draft
model's pools, the EAGLE head's), shared by both proposers.

A request's state is keyed by `id(req)` and remembers the request itself (an id can be reused
once a request is gone), its row of the draft's `req_to_token`, how many entries hold committed
KV and how many have a slot (committed, then this step's drafts).
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

import torch

from radixgen.radix_cache.memory_pool import ReqToTokenPool, SlotAllocator
from radixgen.runtime.req import Req


class DraftRow(Protocol):
    req: Req
    row: int
    committed_len: int
    written_len: int


State = TypeVar("State", bound=DraftRow)


class DraftRows(Generic[State]):
    """The states of the requests a draft holds rows for, and their slots' bookkeeping."""

    def __init__(self, req_to_token_pool: ReqToTokenPool, slot_allocator: SlotAllocator):
        self.req_to_token_pool = req_to_token_pool
        self.slot_allocator = slot_allocator
        self.states: dict[int, State] = {}  # id(req) -> its state

    def truncate(self, state: State, length: int) -> None:
        """Keeps entries [0, length) of state's row, frees the slots of the rest."""
        length = min(length, state.written_len)
        row_slots = self.req_to_token_pool.req_to_token[state.row]
        if length < state.written_len:
            self.slot_allocator.free(row_slots[length : state.written_len].to(torch.int64))
        state.committed_len = state.written_len = length

    def free(self, state: State) -> None:
        """Gives back state's slots and row, and forgets it."""
        self.truncate(state, 0)
        self.req_to_token_pool.free(state.row)
        del self.states[id(state.req)]

    def release(self, reqs: list[Req]) -> None:
        """Frees the rows of requests not in `reqs` (finished, aborted, retracted: a retracted
        request rebuilds its draft KV if it speculates again), and the drafts of a step the
        decoder declined after proposing (its verification never ran)."""
        present = {id(req): req for req in reqs}
        for key, state in list(self.states.items()):
            if present.get(key) is not state.req:
                self.free(state)
            else:
                self.truncate(state, state.committed_len)

    def held_slots(self) -> int:
        return sum(state.written_len for state in self.states.values())
