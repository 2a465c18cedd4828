"""A workload kind is one registration (webhook/objects/kinds.py), keyed by API group and kind:
Volcano's Job (batch.volcano.sh) beside the batch Job, placed whole as one group; a kind nothing
registers is named in a warning, never silently ignored."""
from __future__ import annotations

import copy

import pytest
from conftest import review_of

from tests.fixtures.shared import leaves_allowed
from webhook.admission import review
from webhook.cli import file_index
from webhook.kube import demo
from webhook.objects.kinds import BY_KEY, kind_of
from webhook.objects.templates import pod_templates
from webhook.settings.config import Config


@pytest.fixture
def index():
    built, _ = file_index(Config(), demo.demo_cluster())
    return built


def task(name: str, replicas: int, gpus: int) -> dict:
    return {"name": name, "replicas": replicas, "template": {
        "metadata": {"annotations": {"topology.scheduler/placement-strategy": "consolidated"}},
        "spec": {"restartPolicy": "OnFailure", "containers": [{
            "name": name, "image": "nvcr.io/nvidia/pytorch:24.01-py3",
            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}}


def volcano_job(scheduler: str | None = "default-scheduler") -> dict:
    """A Volcano Job of a master and three workers of 8 GPUs, its gang all four."""
    spec: dict = {"minAvailable": 4, "tasks": [task("master", 1, 8), task("worker", 3, 8)]}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "metadata": {"name": "vc-train", "namespace": "ml"}, "spec": spec}


def test_volcanos_job_is_its_own_kind_beside_the_batch_job():
    volcano, batch = kind_of("batch.volcano.sh", "Job"), kind_of("batch", "Job")
    assert volcano is not None and batch is not None and volcano is not batch
    assert (volcano.key, batch.key) == ("Job.batch.volcano.sh", "Job") and BY_KEY[volcano.key] is volcano


def test_a_volcano_job_is_placed_whole_as_one_group_every_task_in_one_leaf(index):
    result = review(review_of(volcano_job()), index, Config())
    assert result.outcome == "placed", result.warnings
    assert (result.decision.request.pods, result.decision.request.gpus_per_pod) == (4, 8)
    assert result.decision.request.workload == "Job.batch.volcano.sh ml/vc-train"
    templates = [found.template for found in pod_templates(BY_KEY["Job.batch.volcano.sh"], result.admitted)]
    assert len(templates) == 2 and len({frozenset(leaves_allowed(t)) for t in templates}) == 1
    annotations = templates[0]["metadata"]["annotations"]
    assert annotations["topology.scheduler/reservation"] == "ml/Job.batch.volcano.sh/vc-train"
    assert list(index.ledger.holds) == ["ml/Job.batch.volcano.sh/vc-train"]
    # a batch Job of the same name is another workload, with a hold of its own
    batch = copy.deepcopy(volcano_job())
    batch.update(apiVersion="batch/v1", spec={"parallelism": 2, "template": task("t", 1, 8)["template"]})
    assert review(review_of(batch), index, Config()).outcome == "placed"
    assert sorted(index.ledger.holds) == ["ml/Job.batch.volcano.sh/vc-train", "ml/Job/vc-train"]


@pytest.mark.parametrize("scheduler", [None, "volcano"])
def test_a_volcano_job_its_own_scheduler_places_is_left_to_it(index, scheduler):
    """Volcano's admission sets `volcano` where the Job names none: its gang scheduler places it."""
    job = volcano_job(scheduler)
    if scheduler is None:
        job["spec"]["schedulerName"] = "volcano"
    result = review(review_of(job), index, Config())
    assert result.outcome == "managed-elsewhere" and not result.patch
    assert any("placed by scheduler volcano" in w for w in result.warnings)


def test_a_kind_nothing_registers_is_named_in_a_warning(index):
    unknown = {"apiVersion": "example.com/v1", "kind": "TrainingRun",
               "metadata": {"name": "run", "namespace": "ml", "annotations": {"topology.scheduler/gpu-count": "8"}},
               "spec": {}}
    result = review(review_of(unknown), index, Config())
    assert result.outcome == "ignored" and not result.patch
    assert result.warnings == ("TrainingRun ml/run (example.com): not a kind topology-webhook places; its "
                               "topology.scheduler annotations are ignored (docs/reference/kinds.md)",)
    quiet = copy.deepcopy(unknown)
    del quiet["metadata"]["annotations"]
    assert review(review_of(quiet), index, Config()).warnings == ()
    nested = copy.deepcopy(quiet)  # our annotation on a pod template only it knows where to find
    nested["spec"] = {"stages": [{"template": task("worker", 2, 8)["template"]}]}
    assert "not a kind topology-webhook places" in review(review_of(nested), index, Config()).warnings[0]
