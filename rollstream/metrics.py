"""Prometheus metrics every stage shares, each stage on its own registry.

``StageMetrics(stage)`` holds the records in/out/dead-lettered counters, the
processing latency histogram and the consumer lag per owned partition; stages add their
own metrics to ``.registry``.
``serve_metrics(port, registry)`` exposes them over HTTP (port 0: not served).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class StageMetrics:
    def __init__(self, stage: str, registry: CollectorRegistry | None = None) -> None:
        self.stage = stage
        self.registry = registry or CollectorRegistry()
        labels = ["stage", "topic"]
        self.records_in = Counter(
            "rollstream_records_in", "Records consumed", labels, registry=self.registry
        ).labels  # call as .records_in(stage, topic).inc()
        self.records_out = Counter(
            "rollstream_records_out", "Records produced and acknowledged", labels, registry=self.registry
        ).labels
        self.dead_lettered = Counter(
            "rollstream_dead_lettered", "Records sent to a dead-letter topic", labels + ["reason"],
            registry=self.registry,
        ).labels
        self.latency = Histogram(
            "rollstream_processing_seconds", "Time from receiving a record to its outputs being acknowledged",
            ["stage"], buckets=LATENCY_BUCKETS, registry=self.registry,
        ).labels(stage)
        self.paused = Gauge(
            "rollstream_paused", "1 while the stage is paused (backpressure)", ["stage"], registry=self.registry
        ).labels(stage)
        self.lag = Gauge(
            "rollstream_consumer_lag", "Records of a partition this process owns that its group has not "
            "finished: the high watermark of the last fetch minus the offset below which all is done",
            ["stage", "group", "topic", "partition"], registry=self.registry,
        )

    def observe_lag(self, group: str, topic: str, partition: int, lag: int) -> None:
        """Lag of one owned partition (``topic``: the registry name, as in records_in)."""
        self.lag.labels(self.stage, group, topic, str(partition)).set(max(0, lag))

    def forget_lag(self, group: str, topic: str, partition: int) -> None:
        """A partition no longer owned: its lag is its next owner's to report."""
        try:
            self.lag.remove(self.stage, group, topic, str(partition))
        except KeyError:
            pass

    def counter(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        """A stage-specific counter on this registry (name gets the rollstream_ prefix)."""
        return Counter(f"rollstream_{name}", doc, list(labels), registry=self.registry)

    def gauge(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        return Gauge(f"rollstream_{name}", doc, list(labels), registry=self.registry)

    def histogram(self, name: str, doc: str, buckets: tuple[float, ...] = LATENCY_BUCKETS,
                  labels: tuple[str, ...] = ()) -> Histogram:
        return Histogram(f"rollstream_{name}", doc, list(labels), buckets=buckets, registry=self.registry)


def serve_metrics(port: int, metrics: StageMetrics) -> None:
    """Serve ``metrics`` on 0.0.0.0:``port`` in a daemon thread; port 0 serves nothing."""
    if port:
        start_http_server(port, registry=metrics.registry)
