"""Workloads that a queue admits later (Kueue): suspended at creation, placed when un-suspended."""
from __future__ import annotations

import copy

import pytest
from conftest import review_of
from fixtures.builders import workload

from tests.fixtures.shared import leaves_allowed
from webhook.admission import review
from webhook.cli import file_index
from webhook.core.injection import GATE, WAITING_FOR
from webhook.kube import demo
from webhook.settings.config import Config


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


def test_a_job_suspended_again_by_its_queue_is_placed_afresh_when_readmitted(demo_index):
    """Its suspension frees nothing by review (its pods' deletions and the hold's time do); its
    re-admission is placed again, replacing the hold it made before."""
    job = suspended_job()
    running = copy.deepcopy(job)
    running["spec"]["suspend"] = False
    placed = review(update_review(job, running), demo_index, Config())
    assert placed.outcome == "placed" and demo_index.stats().gpus_reserved == 16
    preempted = copy.deepcopy(placed.admitted)
    preempted["spec"]["suspend"] = True
    suspended = review(update_review(placed.admitted, preempted), demo_index, Config())
    assert suspended.outcome == "ignored" and not suspended.patch
    readmitted = copy.deepcopy(preempted)
    readmitted["spec"]["suspend"] = False
    again = review(update_review(preempted, readmitted), demo_index, Config())
    assert again.outcome == "placed" and demo_index.stats().gpus_reserved == 16


def test_a_suspended_job_with_a_bad_annotation_is_denied_at_creation(demo_index):
    job = suspended_job()
    job["spec"]["template"]["metadata"]["annotations"]["topology.scheduler/gpu-count"] = "lots"
    result = review(review_of(job), demo_index, Config())
    assert result.outcome == "denied" and "gpu-count=\"lots\"" in result.review["response"]["status"]["message"]


# ----- the peers' annotations, and max-domain ----------------------------------------------------

def placed_job(template_annotations: dict, index, replicas: int = 2, name: str = "train"):
    job = workload("Job", name=name, replicas=replicas, template_annotations=template_annotations)
    return review(review_of(job), index, Config())


@pytest.mark.parametrize("peer, ours", [
    ({"kueue.x-k8s.io/podset-required-topology": "topology.scheduler/leaf"},
     {"topology.scheduler/placement-strategy": "consolidated", "topology.scheduler/max-domain": "leaf"}),
    ({"kai.scheduler/topology-required-placement": "topology.scheduler/spine"},
     {"topology.scheduler/placement-strategy": "consolidated", "topology.scheduler/max-domain": "spine"}),
    ({"kueue.x-k8s.io/podset-preferred-topology": "topology.scheduler/leaf"},
     {"topology.scheduler/placement-strategy": "balanced"}),
    ({"kai.scheduler/topology-preferred-placement": "topology.scheduler/leaf"},
     {"topology.scheduler/placement-strategy": "balanced"}),
])
def test_kueue_and_kai_annotations_place_as_the_equivalent_ones_of_ours(peer, ours):
    theirs_index, _ = file_index(Config(), demo.demo_cluster())
    ours_index, _ = file_index(Config(), demo.demo_cluster())
    theirs, mine = placed_job(peer, theirs_index, replicas=3), placed_job(ours, ours_index, replicas=3)
    assert theirs.outcome == mine.outcome == "placed"
    assert theirs.decision.requirements == mine.decision.requirements
    assert theirs.decision.assignment == mine.decision.assignment
    spec_of = lambda result: result.admitted["spec"]["template"]["spec"]  # noqa: E731
    assert spec_of(theirs).get("affinity") == spec_of(mine).get("affinity")


def test_max_domain_leaf_waits_rather_than_spanning_leaves(demo_index):
    no_gates, _ = file_index(Config(gate_waits=False), demo.demo_cluster())
    for index in (demo_index, no_gates):
        for name in ("a", "b"):  # the two idle leaves taken
            assert placed_job({"topology.scheduler/placement-strategy": "consolidated"}, index, 4, name).outcome \
                == "placed"
    capped = placed_job({"topology.scheduler/max-domain": "leaf"}, demo_index, 4, "capped")
    assert capped.outcome == "waiting"
    template = capped.admitted["spec"]["template"]
    # held by the gate until a leaf holds it (the releaser pins it there), waiting for the leaf that fits first
    assert template["spec"]["schedulingGates"] == [{"name": GATE}]
    assert capped.decision.scope.level_name == "leaf"
    assert template["metadata"]["annotations"][WAITING_FOR].endswith(f"={capped.decision.scope.name}")
    pinned = review(review_of(workload("Job", name="capped", replicas=4, template_annotations={
        "topology.scheduler/max-domain": "leaf"})), no_gates, Config(gate_waits=False))
    assert len(leaves_allowed(pinned.admitted["spec"]["template"])) == 1  # without the gate: pinned to that leaf
    spanning = placed_job({"topology.scheduler/placement-strategy": "consolidated"}, demo_index, 4, "spanning")
    assert spanning.outcome == "placed" and len(spanning.decision.domains) > 1  # without the cap: across leaves


@pytest.mark.parametrize("annotations, fragment", [
    ({"topology.scheduler/max-domain": "rack"},
     'annotation topology.scheduler/max-domain="rack": max-domain \'rack\' is not a topology level; allowed: zone,'),
    ({"kueue.x-k8s.io/podset-required-topology": "example.com/block"},
     'annotation kueue.x-k8s.io/podset-required-topology="example.com/block": max-domain'),
])
def test_a_max_domain_that_names_no_level_is_denied_naming_the_annotation(annotations, fragment, demo_index):
    result = placed_job(annotations, demo_index)
    assert result.outcome == "denied"
    assert fragment in result.review["response"]["status"]["message"]


def test_a_group_larger_than_any_domain_of_its_max_level_is_denied_with_the_largest(demo_index):
    result = placed_job({"topology.scheduler/max-domain": "leaf"}, demo_index, 5)
    assert result.outcome == "denied"
    assert "no leaf holds that many even when idle (at most 4)" in result.review["response"]["status"]["message"]


# ----- coexistence: what another queue or scheduler places is never ours to block ---------------

def kueue_tas_job(level: str = "topology.scheduler/leaf") -> dict:
    """A Job as Kueue's topology-aware scheduling runs it: queue label, suspended, the podset's level."""
    job = workload("Job", replicas=4, template_annotations={"kueue.x-k8s.io/podset-required-topology": level})
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    job["spec"]["suspend"] = True
    return job


def unsuspended_by_kueue_tas(job: dict) -> dict:
    """Kueue's un-suspend UPDATE of a TAS Job: its topology gate and podset label on the template."""
    admitted = copy.deepcopy(job)
    admitted["spec"]["suspend"] = False
    template = admitted["spec"]["template"]
    template["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/topology"}]
    template["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    template["metadata"].setdefault("labels", {})["kueue.x-k8s.io/podset"] = "main"
    return admitted


def test_kueues_topology_aware_job_is_left_to_kueue_at_creation_and_at_its_unsuspend(demo_index):
    job = kueue_tas_job()
    created = review(review_of(job), demo_index, Config())
    assert created.outcome == "managed-elsewhere" and not created.patch and not created.warnings
    admitted = review(update_review(job, unsuspended_by_kueue_tas(job)), demo_index, Config())
    # the update the apiserver would refuse if it changed env or anything but scheduling directives
    assert admitted.outcome == "managed-elsewhere" and not admitted.patch
    assert demo_index.stats().gpus_reserved == 0


def test_kueues_pods_are_left_to_kueue(demo_index):
    """The pods of a Kueue TAS Job carry its gate; a pod Kueue queues carries its queue label."""
    pod = workload("Pod", template_annotations={"kueue.x-k8s.io/podset-required-topology": "topology.scheduler/leaf",
                                                "topology.scheduler/placement-strategy": "consolidated"})
    pod["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/topology"}]
    gated = review(review_of(pod), demo_index, Config())
    assert gated.outcome == "managed-elsewhere" and not gated.patch
    assert any("placed by Kueue" in w and "not applied" in w for w in gated.warnings)  # it asked for ours
    queued = workload("Pod", template_annotations={"topology.scheduler/gpu-count": "8"})
    queued["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    assert review(review_of(queued), demo_index, Config()).outcome == "managed-elsewhere"
    assert demo_index.stats().gpus_reserved == 0


def test_pods_naming_another_scheduler_are_left_to_it(demo_index):
    job = workload("Job", replicas=2, template_annotations={"kai.scheduler/topology-required-placement":
                                                            "topology.scheduler/leaf"})
    job["spec"]["template"]["spec"]["schedulerName"] = "kai-scheduler"
    result = review(review_of(job), demo_index, Config())
    assert result.outcome == "managed-elsewhere" and not result.patch
    assert demo_index.stats().gpus_reserved == 0


def test_an_unsuspend_changes_only_what_the_apiserver_lets_a_suspended_jobs_template_change(demo_index):
    """Env, spread constraints and the scheduler name of a Job's template are immutable even
    while it is suspended; node affinity, gates, labels and annotations are not
    (k8s.io/kubernetes pkg/apis/batch/validation validatePodTemplateUpdate)."""
    for strategy in ("consolidated", "distributed"):
        job = suspended_job()
        job["metadata"]["name"] = f"train-{strategy}"
        job["spec"]["template"]["metadata"]["annotations"]["topology.scheduler/placement-strategy"] = strategy
        admitted = copy.deepcopy(job)
        admitted["spec"]["suspend"] = False
        result = review(update_review(job, admitted), demo_index, Config())
        assert result.outcome == "placed"
        before, after = job["spec"]["template"], result.admitted["spec"]["template"]
        mutable = ("affinity", "nodeSelector", "tolerations", "schedulingGates")
        assert {k: v for k, v in after["spec"].items() if k not in mutable} == \
            {k: v for k, v in before["spec"].items() if k not in mutable}
        assert after["spec"].get("affinity", {}).keys() <= {"nodeAffinity"}


def test_a_job_that_ran_before_its_suspension_is_not_placed_at_its_unsuspend(demo_index):
    job = suspended_job()
    job["status"] = {"startTime": "2026-11-28T10:00:00Z"}
    admitted = copy.deepcopy(job)
    admitted["spec"]["suspend"] = False
    result = review(update_review(job, admitted), demo_index, Config())
    assert result.outcome == "ignored" and not result.patch
    assert any("ran before it was suspended" in w for w in result.warnings)
    assert demo_index.stats().gpus_reserved == 0


def test_a_job_suspended_by_a_later_webhook_carries_nothing_of_ours(demo_index):
    """Kueue's webhook may suspend a Job after ours placed it; on reinvocation we take it back."""
    job = workload("Job", replicas=2, template_annotations={"topology.scheduler/placement-strategy": "consolidated"})
    job["spec"]["template"]["spec"]["schedulerName"] = "topology-aware-scheduler"
    placed = review(review_of(job), demo_index, Config())
    assert placed.outcome == "placed"
    suspended = copy.deepcopy(placed.admitted)
    suspended["spec"]["suspend"] = True
    again = review(review_of(suspended), demo_index, Config())
    assert again.outcome == "suspended"
    template = again.admitted["spec"]["template"]
    assert not any(k.startswith("topology.scheduler/") and k not in job["spec"]["template"]["metadata"]["annotations"]
                   for k in template["metadata"].get("annotations", {}))
    assert "affinity" not in template["spec"] and template["spec"]["schedulerName"] == "default-scheduler"
