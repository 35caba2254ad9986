"""Prometheus metrics of one server (`GET /metrics`), in a registry of their own.

Names follow SGLang's (`sglang:prompt_tokens_total` is `radixgen:prompt_tokens_total`), and
every series carries a `model_name` label (the served name), so dashboards built for SGLang
read them by swapping the prefix; docs/server.md maps them to SGLang's and vLLM's names.

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
PREFIX = "radixgen:"


class _ModelLabelled:
    """A labelled metric with its `model_name` filled in: `.labels(outcome=...)` as before."""

    def __init__(self, metric, model_name: str):
        self.metric, self.model_name = metric, model_name

    def labels(self, **labels: str):
        return self.metric.labels(model_name=self.model_name, **labels)


class ServerMetrics:
    def __init__(self, model_name: str = ""):
        self.registry = CollectorRegistry()

        def series(kind, name: str, description: str, **options):
            metric = kind(
                PREFIX + name, description, ["model_name"], registry=self.registry, **options
            )
            return metric.labels(model_name=model_name)

        self.requests = _ModelLabelled(
            Counter(
                PREFIX + "num_requests",
                "Requests by outcome: finished, aborted (client left), rejected (bad input or "
                "full).",
                ["model_name", "outcome"],
                registry=self.registry,
            ),
            model_name,
        )
        self.prompt_tokens = series(Counter, "prompt_tokens", "Prompt tokens of finished requests.")
        self.cached_tokens = series(
            Counter, "cached_tokens", "Prompt tokens served from the radix cache."
        )
        self.generation_tokens = series(Counter, "generation_tokens", "Generated tokens.")
        self.num_running_reqs = series(Gauge, "num_running_reqs", "Requests in the running batch.")
        self.num_queued_reqs = series(Gauge, "num_queue_reqs", "Requests waiting for admission.")
        self.kv_usage = series(Gauge, "token_usage", "Fraction of KV slots in use (0..1).")
        self.cache_hit_rate = series(
            Gauge, "cache_hit_rate", "Cached prompt tokens / prompt tokens since start (0..1)."
        )
        self.spec_accept_length = series(
            Gauge,
            "spec_accept_length",
            "Mean tokens a request gains per speculative verify step (0: none ran).",
        )
        self.time_to_first_token_s = series(
            Histogram,
            "time_to_first_token_seconds",
            "Time from arrival to the first output token.",
            buckets=_TTFT_BUCKETS_S,
        )
        self.time_per_output_token_s = series(
            Histogram,
            "inter_token_latency_seconds",
            "Decode time per output token after the first (mean per request).",
            buckets=_TPOT_BUCKETS_S,
        )
        self.e2e_latency_s = series(
            Histogram,
            "e2e_request_latency_seconds",
            "Time from arrival to the last output token.",
            buckets=_E2E_BUCKETS_S,
        )

    def observe_scheduler(self, stats: SchedulerStats) -> None:
        self.num_running_reqs.set(stats.num_running_reqs)
        self.num_queued_reqs.set(stats.num_queued_reqs)
        self.kv_usage.set(stats.kv_usage)
        self.cache_hit_rate.set(stats.cache_hit_rate)
        self.spec_accept_length.set(stats.spec_accept_length)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
