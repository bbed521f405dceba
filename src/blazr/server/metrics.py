"""Prometheus metrics, named `blazr:*` after vLLM's `vllm:*` so the same dashboards work.

Gauges are read live at scrape time from the engine (sequences running and waiting, cache usage), and so
are the counters the engine keeps itself (the prefix cache's, cumulative token counts: exposed as counters,
with no second copy to keep in step); the other counters and the histograms are fed by the engine thread
through the `EngineObserver` hooks, and by the error handlers (`blazr:request_errors_total`). Each app owns
its registry, so several apps can live in one process.

| metric | kind | vLLM counterpart |
|---|---|---|
| blazr:num_requests_running / _waiting | gauge | vllm:num_requests_running / _waiting |
| blazr:kv_cache_usage_perc | gauge (0–1) | vllm:kv_cache_usage_perc |
| blazr:prompt_tokens_total, blazr:generation_tokens_total | counter | same |
| blazr:prefix_cache_queries_total / _hits_total (tokens) | counter | vllm:prefix_cache_queries / _hits |
| blazr:request_success_total{finished_reason=stop,length,abort} | counter | same |
| blazr:request_errors_total{status_code} | counter | (none: HTTP errors answered) |
| blazr:time_to_first_token_seconds | histogram | same |
| blazr:inter_token_latency_seconds | histogram | same |
| blazr:e2e_request_latency_seconds | histogram | same |
| blazr:request_prompt_tokens, blazr:request_generation_tokens | histogram | same |
| blazr:spec_decode_num_drafts_total, _num_draft_tokens_total, _num_accepted_tokens_total | counter | same |
| blazr:spec_decode_num_accepted_tokens_per_pos_total{position} | counter | same |

| blazr:model_state{model,state} | gauge (1 for a model's state) | (llama-server router's model status) |

The speculative-decoding counters (engine/speculative.py) exist only when speculation is on; the model
states only with several models (server/model_pool.py), where the engine gauges and counters add up the
models loaded now (an unload makes those counters drop: Prometheus reads it as a reset).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from blazr.engine.speculative import SpecStats

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


def _token_buckets(max_len: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, … up to max_len (vLLM's build_1_2_5_buckets)."""
    out: list[float] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_len:
                return tuple(out)
            out.append(float(m * scale))
        scale *= 10


class _PrefixCacheCounters(Collector):
    """`blazr:prefix_cache_queries_total` and `_hits_total`, read from the engine's cumulative counts at
    every scrape (0 until an engine is bound)."""

    QUERIES = ("blazr:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
    HITS = ("blazr:prefix_cache_hits", "Prompt tokens found in the prefix cache (their prefill skipped).")

    def __init__(self) -> None:
        self.created = time.time()  # the `_created` sample, as prometheus_client's own counters have it
        self.read_queries: Callable[[], int] = lambda: 0
        self.read_hits: Callable[[], int] = lambda: 0

    def describe(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(*self.QUERIES)
        yield CounterMetricFamily(*self.HITS)

    def collect(self) -> Iterator[CounterMetricFamily]:
        # Hits first: the engine thread may admit a request between the two reads, and as it adds to its
        # queries before its hits (engine/cache_manager.py), read in this order no scrape shows more hits
        # than queries.
        hits = self.read_hits()
        queries = self.read_queries()
        yield CounterMetricFamily(*self.QUERIES, value=queries, created=self.created)
        yield CounterMetricFamily(*self.HITS, value=hits, created=self.created)


class _SpecDecodeCounters(Collector):
    """Speculative decoding's counts (vLLM's `spec_decode_*` names), read from the engine's speculator at
    every scrape; nothing when speculation is off."""

    NAMES = (
        ("blazr:spec_decode_num_drafts", "Verifications of drafted tokens.", "num_drafts"),
        ("blazr:spec_decode_num_draft_tokens", "Tokens drafted.", "num_draft_tokens"),
        ("blazr:spec_decode_num_accepted_tokens", "Drafted tokens accepted.", "num_accepted_tokens"),
    )
    PER_POS = ("blazr:spec_decode_num_accepted_tokens_per_pos", "Drafted tokens accepted, by draft position.")

    def __init__(self) -> None:
        self.created = time.time()
        self.read: Callable[[], SpecStats | None] = lambda: None

    def describe(self) -> Iterator[CounterMetricFamily]:
        return iter(())  # present only once an engine with speculation is bound

    def collect(self) -> Iterator[CounterMetricFamily]:
        stats = self.read()
        if stats is None:
            return
        for name, doc, field in self.NAMES:
            yield CounterMetricFamily(name, doc, value=getattr(stats, field), created=self.created)
        per_pos = CounterMetricFamily(*self.PER_POS, labels=["position"], created=self.created)
        for i, n in enumerate(stats.accepted_per_position):
            per_pos.add_metric([str(i)], n, created=self.created)
        yield per_pos


class _ModelStates:
    """`blazr:model_state{model, state}`: 1 for each model's current state, 0 for its others."""

    NAME = ("blazr:model_state", "State of each model of a multi-model server (1: the current one).")

    def __init__(self, states: tuple[str, ...]) -> None:
        self.states = states
        self.read: Callable[[], dict[str, str]] = dict

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # present only with a model pool

    def collect(self) -> Iterator[GaugeMetricFamily]:
        models = self.read()
        if not models:
            return
        gauge = GaugeMetricFamily(*self.NAME, labels=["model", "state"])
        for name, current in models.items():
            for state in self.states:
                gauge.add_metric([name, state], 1.0 if state == current else 0.0)
        yield gauge


class Metrics:
    """The registry and every metric; implements `EngineObserver` for the engine thread."""

    def __init__(self, max_model_len_hint: int = 1 << 20) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        self.running = Gauge("blazr:num_requests_running", "Sequences in the running batch.", registry=r)
        self.waiting = Gauge("blazr:num_requests_waiting", "Sequences waiting for a slot.", registry=r)
        self.cache_usage = Gauge(
            "blazr:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1).", registry=r
        )
        self.prompt_tokens = Counter("blazr:prompt_tokens", "Prompt tokens prefilled.", registry=r)
        self.generation_tokens = Counter("blazr:generation_tokens", "Tokens generated.", registry=r)
        self.prefix_cache = _PrefixCacheCounters()
        r.register(self.prefix_cache)
        self.spec_decode = _SpecDecodeCounters()
        r.register(self.spec_decode)
        self.model_states = _ModelStates(("unloaded", "loading", "loaded", "sleeping", "failed"))
        r.register(self.model_states)
        self.success = Counter(
            "blazr:request_success",
            "Finished requests by finish reason (abort: cancelled or client gone).",
            ["finished_reason"],
            registry=r,
        )
        for reason in ("stop", "length", "abort"):
            self.success.labels(reason)
        self.errors = Counter(
            "blazr:request_errors",
            "Requests answered with an error, by HTTP status.",
            ["status_code"],
            registry=r,
        )
        self.ttft = Histogram(
            "blazr:time_to_first_token_seconds",
            "Time from submission to the first generated token.",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "blazr:inter_token_latency_seconds",
            "Time between two tokens of one sequence.",
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "blazr:e2e_request_latency_seconds",
            "Time from submission to the last token of a request.",
            buckets=E2E_BUCKETS,
            registry=r,
        )
        buckets = _token_buckets(max_model_len_hint)
        self.request_prompt_tokens = Histogram(
            "blazr:request_prompt_tokens", "Prompt length of finished requests.", buckets=buckets, registry=r
        )
        self.request_generation_tokens = Histogram(
            "blazr:request_generation_tokens",
            "Tokens generated by finished requests (all n samples).",
            buckets=buckets,
            registry=r,
        )

    def bind_engine(
        self,
        num_running: Callable[[], float],
        num_waiting: Callable[[], float],
        cache_usage: Callable[[], float],
        prefix_cache_queries: Callable[[], int],
        prefix_cache_hits: Callable[[], int],
        spec_stats: Callable[[], SpecStats | None] = lambda: None,
    ) -> None:
        """Read the gauges and the engine's own counters live from the engine at every scrape."""
        self.spec_decode.read = spec_stats
        self.running.set_function(num_running)
        self.waiting.set_function(num_waiting)
        self.cache_usage.set_function(cache_usage)
        self.prefix_cache.read_queries = prefix_cache_queries
        self.prefix_cache.read_hits = prefix_cache_hits

    def bind_models(self, states: Callable[[], dict[str, str]]) -> None:
        """A multi-model server: read each model's state ({name: state}) at every scrape."""
        self.model_states.read = states

    def render(self) -> tuple[bytes, str]:
        """(body, content type) of the /metrics page."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def on_error(self, status: int) -> None:
        self.errors.labels(str(status)).inc()

    # ---------------------------------------------------------------------------- EngineObserver hooks

    def on_tokens(self, num_tokens: int, ttft: float | None, itl: float | None) -> None:
        self.generation_tokens.inc(num_tokens)
        if ttft is not None:
            self.ttft.observe(ttft)
        if itl is not None:
            self.itl.observe(itl)

    def on_prompt(self, num_prompt_tokens: int) -> None:
        self.prompt_tokens.inc(num_prompt_tokens)

    def on_finished(
        self, finish_reason: str, e2e: float, num_prompt_tokens: int, num_generation_tokens: int
    ) -> None:
        self.success.labels(finish_reason).inc()
        if finish_reason != "abort":
            self.e2e.observe(e2e)
            self.request_prompt_tokens.observe(num_prompt_tokens)
            self.request_generation_tokens.observe(num_generation_tokens)
