"""Prometheus metrics of one server (`GET /metrics`), in a registry of their own.

Counters and latency histograms are updated by the tokenizer manager as outputs arrive;
the scheduler's gauges (running, queued, KV usage, hit rate) are refreshed from its stats
at each scrape, so they are never stale.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from radixgen.runtime.io_struct import SchedulerStats

# Latency buckets in seconds: from sub-millisecond GPU decode steps to minute-long CPU runs.
_TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TPOT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
_E2E_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class ServerMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter(
            "radixgen_requests",
            "Requests by outcome: finished, aborted (client left), rejected (bad input or full).",
            ["outcome"],
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "radixgen_prompt_tokens", "Prompt tokens of finished requests.", registry=registry
        )
        self.cached_tokens = Counter(
            "radixgen_cached_prompt_tokens",
            "Prompt tokens served from the radix cache.",
            registry=registry,
        )
        self.generation_tokens = Counter(
            "radixgen_generation_tokens", "Generated tokens.", registry=registry
        )
        self.num_running_reqs = Gauge(
            "radixgen_num_running_requests", "Requests in the running batch.", registry=registry
        )
        self.num_queued_reqs = Gauge(
            "radixgen_num_queued_requests", "Requests waiting for admission.", registry=registry
        )
        self.kv_usage = Gauge(
            "radixgen_kv_cache_usage", "Fraction of KV slots in use (0..1).", registry=registry
        )
        self.cache_hit_rate = Gauge(
            "radixgen_cache_hit_rate",
            "Cached prompt tokens / prompt tokens since start (0..1).",
            registry=registry,
        )
        self.time_to_first_token_s = Histogram(
            "radixgen_time_to_first_token_seconds",
            "Time from arrival to the first output token.",
            buckets=_TTFT_BUCKETS_S,
            registry=registry,
        )
        self.time_per_output_token_s = Histogram(
            "radixgen_time_per_output_token_seconds",
            "Decode time per output token after the first.",
            buckets=_TPOT_BUCKETS_S,
            registry=registry,
        )
        self.e2e_latency_s = Histogram(
            "radixgen_e2e_request_latency_seconds",
            "Time from arrival to the last output token.",
            buckets=_E2E_BUCKETS_S,
            registry=registry,
        )

    def observe_scheduler(self, stats: SchedulerStats) -> None:
        self.num_running_reqs.set(stats.num_running_reqs)
        self.num_queued_reqs.set(stats.num_queued_reqs)
        self.kv_usage.set(stats.kv_usage)
        self.cache_hit_rate.set(stats.cache_hit_rate)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
