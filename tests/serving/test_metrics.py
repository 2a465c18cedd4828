"""Metric names our users know, counted per admission outcome, and merged across worker processes."""
import pathlib
import subprocess
import sys
from dataclasses import dataclass

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.shared import samples
from webhook import __version__
from webhook.admission import AdmissionOutcome
from webhook.objects.feed import index_of
from webhook.serving.metrics import Metrics


@dataclass
class Stats:
    gpus_total: int = 64
    gpus_used: int = 24
    gpus_reserved: int = 8
    gpus_provisional: int = 2
    allocation_ratio: float = 0.5
    fragmentation_ratio: float = 0.25
    domain_utilization: tuple = (("spine", "spine-1", 0.75), ("leaf", "leaf-2", 1.0))
    levels: tuple = ("cloud.google.com/gce-topology-block", "cloud.google.com/gce-topology-subblock")
    preset: str = "gke"
    gated_pods: int = 3
    gated_oldest_seconds: float = 90.0




def test_decisions_are_counted_by_kind_strategy_and_outcome_and_ignored_ones_only_timed():
    metrics = Metrics.create()
    metrics.record_admission("Job", "consolidated", AdmissionOutcome.PLACED, 0.002)
    metrics.record_admission("Job", "consolidated", AdmissionOutcome.PLACED, 0.003)
    metrics.record_admission("Pod", None, AdmissionOutcome.DENIED, 0.001)
    metrics.record_admission("Service", None, AdmissionOutcome.IGNORED, 0.0001)
    got = samples(metrics)
    placed = (("kind", "Job"), ("outcome", "placed"), ("strategy", "consolidated"))
    assert got[("topology_placement_decisions_total", placed)] == 2
    assert got[("topology_placement_decisions_total", (("kind", "Pod"), ("outcome", "denied"), ("strategy", "none")))] == 1
    assert not any(labels and dict(labels).get("kind") == "Service" for _, labels in got)
    assert got[("topology_scheduler_latency_seconds_count", ())] == 4
    assert got[("topology_admission_fail_open_total", ())] == 0


def test_failed_open_admissions_are_counted_apart():
    metrics = Metrics.create()
    metrics.record_admission("Job", "balanced", AdmissionOutcome.FAILED_OPEN, 0.001)
    assert samples(metrics)[("topology_admission_fail_open_total", ())] == 1


def test_cluster_gauges_are_read_from_the_view_at_scrape_time():
    metrics, stats = Metrics.create(), Stats()
    metrics.watch_cluster(lambda: stats)
    assert samples(metrics)[("topology_gpu_allocation_ratio", ())] == 0.5
    stats.allocation_ratio = 0.75
    got = samples(metrics)
    assert got[("topology_gpu_allocation_ratio", ())] == 0.75
    assert got[("topology_scheduler_domain_fragmentation_ratio", ())] == 0.25
    assert got[("topology_domain_utilization_ratio", (("domain", "leaf-2"), ("level", "leaf")))] == 1.0
    assert got[("topology_cluster_gpus", (("state", "reserved"),))] == 8
    assert got[("topology_cluster_gpus", (("state", "provisional"),))] == 2
    assert (got[("topology_gated_pods", ())], got[("topology_gated_pod_oldest_wait_seconds", ())]) == (3, 90.0)
    levels = ",".join(Stats.levels)
    assert got[("topology_levels_info", (("levels", levels), ("preset", "gke")))] == 1


ROOT = str(pathlib.Path(__file__).parents[2])
WORKER = """
import sys
from webhook.admission import AdmissionOutcome
from webhook.serving.metrics import Metrics
metrics = Metrics.create(sys.argv[1])
for _ in range(int(sys.argv[2])):
    metrics.record_admission("Job", "consolidated", AdmissionOutcome.PLACED, 0.004)
"""


def test_multiprocess_mode_sums_the_counters_of_every_worker(tmp_path, monkeypatch):
    # Real separate processes (as gunicorn workers are), writing to one shared directory.
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    for admissions in (3, 4):
        subprocess.run([sys.executable, "-c", WORKER, str(tmp_path), str(admissions)], env=env, check=True,
                       timeout=60, cwd=ROOT)
    assert len(list(tmp_path.glob("counter_*.db"))) == 2
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    reader = Metrics(str(tmp_path))  # the scraping worker; its own metrics add nothing here
    got = samples(reader)
    placed = (("kind", "Job"), ("outcome", "placed"), ("strategy", "consolidated"))
    assert got[("topology_placement_decisions_total", placed)] == 7
    assert got[("topology_scheduler_latency_seconds_count", ())] == 7


def test_multiprocess_mode_needs_the_directory_in_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    with pytest.raises(ValueError, match="PROMETHEUS_MULTIPROC_DIR"):
        Metrics.create(str(tmp_path))


def test_counters_have_no_created_timestamp_series():
    metrics = Metrics.create()
    metrics.record_admission("Job", "balanced", AdmissionOutcome.PLACED, 0.001)
    assert "_created" not in metrics.render()[0].decode()


def test_build_info_process_and_platform_collectors_are_exposed():
    got = samples(Metrics.create())
    (labels,) = [dict(labels) for name, labels in got if name == "topology_webhook_build_info"]
    assert labels["version"] == __version__ and labels["python"].count(".") == 2
    assert ("process_cpu_seconds_total", ()) in got and ("process_resident_memory_bytes", ()) in got
    assert any(name == "python_info" for name, _ in got)


def test_the_age_of_the_api_fed_view_is_exposed_once_it_has_one():
    metrics, age = Metrics.create(), [None]
    metrics.watch_feed(lambda: age[0])
    assert not any(name == "topology_cluster_view_age_seconds" for name, _ in samples(metrics))  # not listed yet
    age[0] = 12.5
    assert samples(metrics)[("topology_cluster_view_age_seconds", ())] == 12.5


def test_4xx_answers_are_counted_by_reason(client, metrics):
    assert client.post("/mutate", data="{", content_type="application/json").status_code == 400
    assert client.post("/mutate", data="{}", content_type="text/plain").status_code == 415
    assert client.post("/mutate", json={"kind": "Pod"}).status_code == 400
    assert client.get("/nowhere").status_code == 404
    text = metrics.render()[0].decode()
    got = {(s.name, s.labels.get("reason")): s.value for family in text_string_to_metric_families(text)
           for s in family.samples if s.name == "topology_admission_rejected_requests_total"}
    assert got == {("topology_admission_rejected_requests_total", "not_json"): 1,
                   ("topology_admission_rejected_requests_total", "not_json_type"): 1,
                   ("topology_admission_rejected_requests_total", "not_a_review"): 1,
                   ("topology_admission_rejected_requests_total", "http_404"): 1}


def test_per_domain_gauges_leave_out_domains_of_one_node():
    from webhook.kube.demo import make_node
    from webhook.settings.config import Config
    from webhook.settings.presets import PRESETS
    config = Config(levels=PRESETS["gke"])
    nodes = [make_node(f"host-{i}", {"cloud.google.com/gce-topology-block": "b1",
                                      "cloud.google.com/gce-topology-subblock": f"sb{i // 2}",
                                      "cloud.google.com/gce-topology-host": f"h{i}"}) for i in range(4)]
    levels = {level for level, _, _ in index_of(config, nodes).stats().domain_utilization}
    assert levels == {"block", "subblock"}  # no series per host, which is a node
