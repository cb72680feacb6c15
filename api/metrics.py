"""Prometheus metrics of one app instance: requests, probe durations and failures, advice staleness."""

from __future__ import annotations

import time
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class _Staleness:
    def __init__(self, read: Callable[[], tuple[int, int, float]]):
        self._read = read

    def collect(self):
        try:
            known, stale, oldest = self._read()
        except Exception:  # the store is down: report nothing rather than fail the scrape
            return
        yield GaugeMetricFamily("tame_destinations", "Destinations with a stored fit", value=known)
        yield GaugeMetricFamily("tame_stale_destinations", "Destinations whose probes are older than the TTL", value=stale)
        yield GaugeMetricFamily("tame_oldest_probe_age_seconds", "Age of the oldest current probe run", value=oldest)


class _CacheReads:
    def __init__(self, read: Callable[[], dict[str, int]]):
        self._read = read

    def collect(self):
        family = CounterMetricFamily("tame_advice_cache_reads", "Store reads by the advice cache: an entry kept "
                                     "(unchanged) or rebuilt (reloaded)", labels=["result"])
        for result, count in self._read().items():
            family.add_metric([result], count)
        yield family


class Metrics:
    def __init__(self, staleness: Callable[[], tuple[int, int, float]],
                 cache_reads: Callable[[], dict[str, int]] = dict):
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("tame_http_requests", "HTTP requests", ["method", "route", "status"],
                                registry=self.registry)
        self.latency = Histogram("tame_http_request_duration_seconds", "HTTP request latency", ["route"],
                                 registry=self.registry,
                                 buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5))
        self.probe_seconds = Histogram("tame_probe_duration_seconds", "Wall time of a probe job (all levels)",
                                       registry=self.registry, buckets=(1, 5, 10, 30, 60, 120, 300, 600))
        self.probe_failures = Counter("tame_probe_failures", "Probe jobs that failed", ["reason"],
                                      registry=self.registry)
        self.advice_served = Counter("tame_advice_served", "Advice answers", ["stale"], registry=self.registry)
        self.registry.register(_Staleness(staleness))
        self.registry.register(_CacheReads(cache_reads))

    def observe_probe(self, dest: str, seconds: float, error: str | None) -> None:
        self.probe_seconds.observe(seconds)
        if error:
            self.probe_failures.labels(reason=error.split(":", 1)[0][:40]).inc()


class MetricsMiddleware:
    """Pure ASGI (no BaseHTTPMiddleware overhead): counts each request by route template and status."""

    def __init__(self, app, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = 500

        async def send_wrapper(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            label = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(scope["method"], label, str(status)).inc()
            self.metrics.latency.labels(label).observe(time.perf_counter() - started)
