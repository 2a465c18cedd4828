"""Workloads that a queue admits later (Kueue): suspended at creation, placed when un-suspended."""
from __future__ import annotations

import copy

import pytest
from conftest import review_of
from fixtures.builders import workload
from test_groups import leaves_allowed

from webhook import demo
from webhook.admission import review
from webhook.cli import file_index
from webhook.config import Config


@pytest.fixture
def demo_index():
    index, _ = file_index(Config(), demo.demo_cluster())
    return index


def suspended_job() -> dict:
    """A Job as a Kueue user submits it: queue label, suspended, 2 pods x 8 GPUs."""
    job = workload("Job", replicas=2, template_annotations={"topology.scheduler/placement-strategy": "consolidated"})
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    job["spec"]["suspend"] = True
    return job


def update_review(old: dict, new: dict) -> dict:
    sent = review_of(new)
    sent["request"]["operation"] = "UPDATE"
    sent["request"]["oldObject"] = old
    return sent


def test_a_suspended_job_reserves_nothing_and_is_placed_when_unsuspended_inside_the_queues_node_selection(
        demo_index):
    job = suspended_job()
    created = review(review_of(job), demo_index, Config())
    assert created.outcome == "suspended" and not created.patch
    assert demo_index.stats().gpus_reserved == 0
    assert any("suspended" in w for w in created.warnings)
    # Kueue admits it: one update writes its node selection and un-suspends
    admitted = copy.deepcopy(job)
    admitted["spec"]["suspend"] = False
    admitted["spec"]["template"]["spec"]["nodeSelector"] = {"topology.scheduler/leaf": "leaf-7"}
    result = review(update_review(job, admitted), demo_index, Config())
    assert result.outcome == "placed"
    assert leaves_allowed(result.admitted["spec"]["template"]) == {"leaf-7"}
    assert demo_index.stats().gpus_reserved == 16


def test_updates_of_a_suspended_job_that_keep_it_suspended_place_nothing(demo_index):
    job = suspended_job()
    relabelled = copy.deepcopy(job)
    relabelled["metadata"]["labels"] = {"team": "b"}
    result = review(update_review(job, relabelled), demo_index, Config())
    assert result.outcome == "ignored" and not result.patch and demo_index.stats().gpus_reserved == 0


def test_a_suspended_job_with_a_bad_annotation_is_denied_at_creation(demo_index):
    job = suspended_job()
    job["spec"]["template"]["metadata"]["annotations"]["topology.scheduler/gpu-count"] = "lots"
    result = review(review_of(job), demo_index, Config())
    assert result.outcome == "denied" and "gpu-count=\"lots\"" in result.review["response"]["status"]["message"]
