"""Prometheus metrics of one gateway process (served on GET /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("rlgate_requests", "HTTP requests", ["route", "status"], registry=r)
        self.latency = Histogram(
            "rlgate_request_latency_seconds",
            "Request latency",
            ["route"],
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )
        self.in_flight = Gauge("rlgate_in_flight_requests", "Requests being generated", registry=r)
        self.prompt_tokens = Counter("rlgate_prompt_tokens", "Prompt tokens", registry=r)
        self.completion_tokens = Counter(
            "rlgate_completion_tokens", "Completion tokens", registry=r
        )
        self.recording_lag = Gauge(
            "rlgate_recording_lag_seconds",
            "Age of the oldest record not yet in the database",
            registry=r,
        )
        self.recording_pending = Gauge(
            "rlgate_recording_pending", "Records spooled but not yet in the database", registry=r
        )
        self.recorded = Gauge(
            "rlgate_recorded_interactions",
            "Interactions written to the database by this process",
            registry=r,
        )
        self.dead_letters = Counter(
            "rlgate_dead_letters",
            "Records the database refused for their content, moved to the dead-letter file "
            "by this process",
            registry=r,
        )
        self.dead_letters_kept = Gauge(
            "rlgate_dead_letters_kept",
            "Records in the dead-letter file (all processes, since it was last cleared)",
            registry=r,
        )
        self.recording_backlog = Gauge(
            "rlgate_recording_backlog_bytes",
            "Bytes of records accepted but not yet in the database (capped: over it, 503)",
            registry=r,
        )
