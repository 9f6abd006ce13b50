"""Prometheus metrics: queue and job state from the database, request counts and latencies.

The database-backed values are read at scrape time (a few COUNT queries), so several service
replicas report the same numbers. ``tunehub_trials_per_second`` is the rate of stored
measurements over the last minute; Prometheus can also ``rate()`` ``tunehub_trials_total``.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

import db

RATE_WINDOW_SECS = 60.0


class StorageCollector(Collector):
    def __init__(self, storage: db.TuningStorage, stale_after_secs: float) -> None:
        self.storage = storage
        self.stale_after_secs = stale_after_secs

    def collect(self):
        try:
            counts = self.storage.job_counts()
            total = self.storage.count_records()
            recent = self.storage.count_records(measured_within_secs=RATE_WINDOW_SECS)
            workers = self.storage.list_workers()
        except db.StorageError:
            up = GaugeMetricFamily("tunehub_database_up", "1 if the database answered the scrape")
            up.add_metric([], 0)
            yield up
            return
        up = GaugeMetricFamily("tunehub_database_up", "1 if the database answered the scrape")
        up.add_metric([], 1)
        yield up
        jobs = GaugeMetricFamily("tunehub_jobs", "jobs by status", labels=["status"])
        for status, n in sorted(counts.items()):
            jobs.add_metric([status], n)
        yield jobs
        queue = GaugeMetricFamily("tunehub_queue_depth", "queued jobs waiting for a worker")
        queue.add_metric([], counts.get("queued", 0))
        yield queue
        trials = CounterMetricFamily("tunehub_trials", "measured candidates stored (all jobs)")
        trials.add_metric([], total)
        yield trials
        rate = GaugeMetricFamily(
            "tunehub_trials_per_second",
            f"measurements stored per second, last {RATE_WINDOW_SECS:.0f} s",
        )
        rate.add_metric([], recent / RATE_WINDOW_SECS)
        yield rate
        by_status = GaugeMetricFamily(
            "tunehub_workers", "registered workers by status", labels=["status"]
        )
        for status in db.types.WORKER_STATUSES:
            by_status.add_metric([status], sum(1 for w in workers if w.status == status))
        yield by_status


class Metrics:
    """One registry per app; :meth:`middleware` wraps the ASGI app to count requests."""

    def __init__(self, storage: db.TuningStorage, stale_after_secs: float) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(StorageCollector(storage, stale_after_secs))
        self.requests = Counter(
            "tunehub_http_requests",
            "HTTP requests",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "tunehub_http_request_duration_seconds",
            "HTTP request latency",
            ["method", "route"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60),
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def middleware(self, app):
        metrics = self

        async def wrapped(scope, receive, send):
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            start = time.perf_counter()
            status_holder = {"status": 500}

            async def send_wrapper(message):
                if message["type"] == "http.response.start":
                    status_holder["status"] = message["status"]
                await send(message)

            try:
                await app(scope, receive, send_wrapper)
            finally:
                route = scope.get("route")
                path = getattr(route, "path", None) or "unmatched"
                method = scope.get("method", "")
                metrics.requests.labels(method, path, str(status_holder["status"])).inc()
                metrics.latency.labels(method, path).observe(time.perf_counter() - start)

        return wrapped
