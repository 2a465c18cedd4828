"""Prometheus metrics: admission counters and latency, and cluster gauges read at scrape time.

Single process: metrics live in a private registry. Several gunicorn workers: counters and the
histogram are written to per-process files in a shared directory (prometheus_client's multiprocess
mode) and merged when scraped, so any worker answers /metrics with the totals of all workers.
The cluster gauges are never stored: `ClusterCollector` computes them from the answering
worker's own cluster view on each scrape, so they cannot go stale or be double-counted.

prometheus_client decides the storage of every metric from a module global chosen at its import;
`Metrics.create` sets it from its argument instead, once per process, before any metric exists.
"""
from __future__ import annotations

import glob
import os
import platform
from typing import Any, Callable, Iterable, Mapping

from prometheus_client import (CollectorRegistry, Counter, Histogram, PlatformCollector, ProcessCollector,
                               disable_created_metrics, generate_latest, multiprocess, values)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from .. import __version__
from ..admission import AdmissionOutcome

LATENCY = "topology_scheduler_latency_seconds"
DECISIONS = "topology_placement_decisions_total"
FAIL_OPEN = "topology_admission_fail_open_total"
DECIDED_ALONE = "topology_claims_decided_alone_total"
DOMAIN_UTILIZATION = "topology_domain_utilization_ratio"
GPU_ALLOCATION = "topology_gpu_allocation_ratio"
FRAGMENTATION = "topology_scheduler_domain_fragmentation_ratio"
CLUSTER_GPUS = "topology_cluster_gpus"
LEVELS_INFO = "topology_levels_info"
GATED_PODS = "topology_gated_pods"
GATED_OLDEST = "topology_gated_pod_oldest_wait_seconds"
BUILD_INFO = "topology_webhook_build_info"
REJECTED = "topology_admission_rejected_requests_total"
VIEW_AGE = "topology_cluster_view_age_seconds"
SCALE_UPS = "topology_provisioning_requests_total"
GATED_RELEASES = "topology_gated_releases_total"
ACCESS_FAILURES = "topology_metrics_access_failures_total"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# The states topology_cluster_gpus counts GPUs in, and what each is.
GPU_STATES: Mapping[str, str] = {
    "total": "GPUs of the nodes in the cluster view",
    "used": "in use by pods (or allocated claims) the cluster view sees",
    "reserved": "held for workloads admitted and not yet bound",
    "provisional": "of those reserved, held for admissions the watch has not shown stored yet: they lapse "
                   "within provisional_hold_seconds unless it does",
}

# Admission handling takes about a millisecond; the apiserver gives up after 10 s by default.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class ClusterCollector:
    """Gauges from the cluster view's `stats()` (a ClusterStats), computed at scrape time."""

    def __init__(self, stats: Callable[[], Any]) -> None:
        self._stats = stats

    def collect(self) -> Iterable[GaugeMetricFamily]:
        stats = self._stats()
        utilization = GaugeMetricFamily(DOMAIN_UTILIZATION, "Share of a topology domain's GPUs in use or reserved",
                                        labels=["level", "domain"])
        for level, domain, ratio in stats.domain_utilization:
            utilization.add_metric([level, domain], ratio)
        gpus = GaugeMetricFamily(CLUSTER_GPUS, "GPUs in the cluster view by state", labels=["state"])
        for state in GPU_STATES:
            gpus.add_metric([state], getattr(stats, f"gpus_{state}"))
        yield utilization
        yield gpus
        yield GaugeMetricFamily(GPU_ALLOCATION, "Share of all GPUs in use or reserved", value=stats.allocation_ratio)
        yield GaugeMetricFamily(GATED_PODS, "Pending pods our scheduling gate holds", value=stats.gated_pods)
        yield GaugeMetricFamily(GATED_OLDEST, "How long the pod our scheduling gate has held longest has waited, "
                                "since this replica first saw it gated", value=stats.gated_oldest_seconds)
        yield GaugeMetricFamily(FRAGMENTATION, "Share of free GPUs stranded outside the largest free blocks",
                                value=stats.fragmentation_ratio)
        levels = GaugeMetricFamily(LEVELS_INFO, "The topology levels in use (label keys, widest first) and the "
                                   "preset levels: auto chose from the nodes' labels, value 1",
                                   labels=["preset", "levels"])
        levels.add_metric([stats.preset, ",".join(stats.levels)], 1)
        yield levels


class InfoCollector:
    """build_info (version and Python, value 1), and the age of the cluster view fed from the API
    when there is one (a file or demo view has no age: it is complete at once)."""

    def __init__(self, version: str) -> None:
        self._version = version
        self.age: Callable[[], float | None] | None = None

    def collect(self) -> Iterable[GaugeMetricFamily]:
        info = GaugeMetricFamily(BUILD_INFO, "The webhook's version and Python, value 1", labels=["version", "python"])
        info.add_metric([self._version, platform.python_version()], 1)
        yield info
        age = self.age() if self.age is not None else None
        if age is not None:
            yield GaugeMetricFamily(VIEW_AGE, "Seconds since the least recently heard API stream made progress",
                                    value=age)


class Metrics:
    """The webhook's metric objects and the registry /metrics is rendered from."""

    def __init__(self, multiprocess_dir: str | None) -> None:
        self.multiprocess_dir = multiprocess_dir
        # In multiprocess mode the metric objects must not be registered: their values are
        # exposed by the MultiProcessCollector reading every worker's files.
        own = None if multiprocess_dir else CollectorRegistry(auto_describe=True)
        self.latency = Histogram(LATENCY, "Time to handle one admission review", buckets=LATENCY_BUCKETS,
                                 registry=own)
        self.decisions = Counter(DECISIONS, "Placement decisions by workload kind, strategy and outcome",
                                 ["kind", "strategy", "outcome"], registry=own)
        self.fail_open = Counter(FAIL_OPEN, "Admissions allowed unmodified because of an internal error",
                                 registry=own)
        self.decided_alone = Counter(DECIDED_ALONE, "Placements or releases not agreed with the other replicas "
                                     "through the API within the claims budget", registry=own)
        # The label values, each with its meaning, are constants of the modules that count them
        # (kube/scaleups.py RESULTS, kube/releaser.py RESULTS, access.py FAILURE_REASONS,
        # app.py REJECTED_REASONS), listed in docs/reference/metrics.md.
        self.scale_ups = Counter(SCALE_UPS, "ProvisioningRequests for groups that wait for nodes, by result",
                                 ["result"], registry=own)
        self.gated_releases = Counter(GATED_RELEASES, "Workloads held by our scheduling gate, by result of a release",
                                      ["result"], registry=own)
        self.access_failures = Counter(ACCESS_FAILURES, "Requests on the metrics port refused or not checked, by "
                                       "reason", ["reason"], registry=own)
        self.rejected = Counter(REJECTED, "Requests answered 4xx, by reason", ["reason"], registry=own)
        self.registry = own or CollectorRegistry(auto_describe=True)
        self.info = InfoCollector(__version__)
        self.registry.register(self.info)
        # What every Python exporter shows: CPU, memory, open files, start time; Python's version.
        self.registry.register(ProcessCollector(registry=None))
        self.registry.register(PlatformCollector(registry=None))
        if multiprocess_dir:
            multiprocess.MultiProcessCollector(self.registry, path=multiprocess_dir)

    @classmethod
    def create(cls, multiprocess_dir: str | None = None) -> "Metrics":
        """Metrics for this process; multiprocess_dir (shared by all workers) selects multiprocess mode.

        The directory must also be in the environment as PROMETHEUS_MULTIPROC_DIR: the library's
        per-process files are placed there. The server sets it before forking workers.
        """
        disable_created_metrics()  # no `_created` twin of every counter: half the series, no use to us
        if multiprocess_dir:
            if os.environ.get(MULTIPROC_ENV) != multiprocess_dir:
                raise ValueError(f"{MULTIPROC_ENV} must be {multiprocess_dir!r} in the environment "
                                 f"for multiprocess metrics, found {os.environ.get(MULTIPROC_ENV)!r}")
            if not getattr(values.ValueClass, "_multiprocess", False):
                values.ValueClass = values.MultiProcessValue()
        return cls(multiprocess_dir)

    def access_failed(self, reason: str) -> None:
        """One failure of the metrics port's access checks (credentials/access.py FAILURE_REASONS)."""
        self.access_failures.labels(reason).inc()

    def watch_cluster(self, stats: Callable[[], Any]) -> None:
        self.registry.register(ClusterCollector(stats))

    def watch_feed(self, age: Callable[[], float | None]) -> None:
        """Expose the age of the index fed from the API (`ApiFeed.age`)."""
        self.info.age = age

    def record_admission(self, kind: str, strategy: str | None, outcome: AdmissionOutcome, seconds: float) -> None:
        """One handled review. `ignored` reviews (nothing to place) count in latency only."""
        self.latency.observe(seconds)
        if outcome is not AdmissionOutcome.IGNORED:
            self.decisions.labels(kind or "unknown", strategy or "none", outcome.value).inc()
        if outcome is AdmissionOutcome.FAILED_OPEN:
            self.fail_open.inc()

    def scale_up(self, result: str) -> None:
        """One ProvisioningRequest created, found there, refused or deleted (webhook/kube/scaleups.py)."""
        self.scale_ups.labels(result).inc()

    def gated_release(self, result: str) -> None:
        """A gated workload started, or one of its pods' patches failed (webhook/kube/releaser.py)."""
        self.gated_releases.labels(result).inc()

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def reset_multiprocess_dir(path: str) -> None:
    """Remove files of an earlier run, which would otherwise be added to this run's counters."""
    for stale in glob.glob(os.path.join(path, "*.db")):
        os.remove(stale)


def mark_worker_dead(pid: int, path: str) -> None:
    """gunicorn child_exit: drop the dead worker's live-gauge files (its counters stay summed)."""
    multiprocess.mark_process_dead(pid, path)
