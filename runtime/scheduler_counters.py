"""`SchedulerCounters`: cumulative token and step counts, and the stats snapshot built on them."""

from __future__ import annotations

from dataclasses import dataclass

from radixgen.runtime.io_struct import SchedulerStats


@dataclass
class SchedulerCounters:
    prompt_tokens: int = 0  # prompt tokens of admitted requests (first admission)
    cached_tokens: int = 0  # of those, found in the radix cache
    computed_prefill_tokens: int = 0  # tokens run through extend forwards (not jump-forward)
    generated_tokens: int = 0  # sampled tokens
    jump_forward_tokens: int = 0  # tokens appended by constrained jump-forward
    forward_steps: int = 0
    mixed_steps: int = 0  # extend forwards that also decoded the running requests
    retractions: int = 0
    finished_reqs: int = 0

    def to_stats(
        self,
        *,
        num_running_reqs: int,
        num_queued_reqs: int,
        kv_total_slots: int,
        kv_free_slots: int,
        kv_cached_slots: int,
        context_length: int,
    ) -> SchedulerStats:
        used = kv_total_slots - kv_free_slots
        return SchedulerStats(
            num_running_reqs=num_running_reqs,
            num_queued_reqs=num_queued_reqs,
            kv_total_slots=kv_total_slots,
            kv_free_slots=kv_free_slots,
            kv_cached_slots=kv_cached_slots,
            kv_used_slots=used - kv_cached_slots,
            kv_usage=used / kv_total_slots,
            cache_hit_rate=self.cached_tokens / max(self.prompt_tokens, 1),
            num_prompt_tokens=self.prompt_tokens,
            num_cached_tokens=self.cached_tokens,
            num_generated_tokens=self.generated_tokens,
            num_computed_prefill_tokens=self.computed_prefill_tokens,
            num_forward_steps=self.forward_steps,
            num_retractions=self.retractions,
            num_finished_reqs=self.finished_reqs,
            max_total_tokens=kv_total_slots,
            context_length=context_length,
            num_jump_forward_tokens=self.jump_forward_tokens,
            num_mixed_steps=self.mixed_steps,
        )
