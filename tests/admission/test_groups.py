"""Groups made by operators: pods that reach us one at a time get one decision for the group."""
from __future__ import annotations

import itertools
import json
import random
import threading

import pytest
from conftest import review_of
from fixtures.builders import container, workload

from tests.fixtures.shared import admit, allowed_nodes, leaves_allowed, lws_pods, operator_pod, pytorchjob_pods
from webhook.admission import review
from webhook.cli import file_index
from webhook.kube import demo
from webhook.objects import feed
from webhook.settings.config import Config

LEAF = "topology.scheduler/leaf"








@pytest.fixture
def fresh_index():
    index, _ = file_index(Config(), demo.demo_cluster())
    return index






@pytest.mark.parametrize("order", list(itertools.permutations(range(4)))[::5])
def test_a_pytorchjobs_pods_admitted_one_by_one_in_any_order_are_pinned_to_one_leaf(order, fresh_index):
    pods = pytorchjob_pods("bert")
    admitted = [admit(pods[i], fresh_index).admitted for i in order]
    leaves = [leaves_allowed(pod) for pod in admitted]
    assert all(len(found) == 1 for found in leaves) and len({frozenset(found) for found in leaves}) == 1, leaves
    # the whole group (4 x 8 GPUs) fits in one leaf only where a leaf is idle: leaf-3 or leaf-7
    assert leaves[0] <= {"leaf-3", "leaf-7"}
    # one hold for the group, under the group's key, for all four pods
    assert fresh_index.stats().gpus_reserved == 32
    assert {pod["metadata"]["annotations"]["topology.scheduler/reservation"] for pod in admitted} == {
        "ml/PyTorchJob/bert"}


def test_pods_of_another_pytorchjob_never_join_the_group(fresh_index):
    first = [admit(pod, fresh_index).admitted for pod in pytorchjob_pods("bert")]
    second = [admit(pod, fresh_index).admitted for pod in pytorchjob_pods("gpt")]
    assert leaves_allowed(first[0]) != leaves_allowed(second[0])
    assert {frozenset(leaves_allowed(pod)) for pod in second} == {frozenset(leaves_allowed(second[0]))}
    assert fresh_index.stats().gpus_reserved == 64


def test_the_same_job_name_in_another_namespace_is_another_group(fresh_index):
    first = admit(pytorchjob_pods("bert")[0], fresh_index).admitted
    other = pytorchjob_pods("bert")[0]
    other["metadata"]["namespace"] = "research"
    second = admit(other, fresh_index).admitted
    assert leaves_allowed(first) != leaves_allowed(second)


def test_a_pytorchjobs_pods_admitted_concurrently_through_the_server_share_one_leaf(apiserver):
    pods = pytorchjob_pods("concurrent-bert")
    results: dict[int, dict] = {}
    start = threading.Barrier(len(pods))

    def send(i: int) -> None:
        start.wait()
        results[i] = apiserver.admit(review_of(pods[i]))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(pods))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(results) == len(pods)
    leaves = {frozenset(leaves_allowed(pod)) for pod in results.values()}
    assert len(leaves) == 1 and len(next(iter(leaves))) == 1, leaves


def test_each_leaderworkerset_group_is_inside_one_leaf_and_groups_are_placed_apart(fresh_index):
    groups = [[admit(pod, fresh_index).admitted for pod in lws_pods("llm", group)] for group in (0, 1)]
    for members in groups:
        leaves = {frozenset(leaves_allowed(pod)) for pod in members}
        assert len(leaves) == 1 and len(next(iter(leaves))) == 1, leaves
    assert fresh_index.stats().gpus_reserved == 64  # two groups of 4 x 8, each held once


def test_a_leaderworkersets_statefulset_is_not_placed_itself():
    statefulset = {"apiVersion": "apps/v1", "kind": "StatefulSet",
                   "metadata": {"name": "llm", "namespace": "ml", "labels": {"leaderworkerset.sigs.k8s.io/name": "llm"}},
                   "spec": {"replicas": 2, "serviceName": "llm", "selector": {"matchLabels": {"a": "b"}},
                            "template": {"metadata": {"labels": {"a": "b", "leaderworkerset.sigs.k8s.io/name": "llm"},
                                                      "annotations": {"topology.scheduler/gpu-count": "16"}},
                                         "spec": {"containers": [container(gpus=8)]}}}}
    index, _ = file_index(Config(), demo.demo_cluster())
    result = review(review_of(statefulset), index, Config())
    assert result.outcome == "ignored" and not result.patch and index.stats().gpus_reserved == 0


def test_a_group_pod_whose_group_size_is_unknown_is_placed_alone_and_says_what_to_add(fresh_index):
    pod = operator_pod("solo", {"ray.io/cluster": "rc"}, {"topology.scheduler/placement-strategy": "consolidated"})
    result = admit(pod, fresh_index)
    assert result.outcome == "placed" and result.decision.request.pods == 1
    assert any("topology.scheduler/group-size" in w and "RayCluster ml/rc" in w for w in result.warnings)


def test_our_group_annotation_groups_any_pods_and_group_size_sizes_the_group(fresh_index):
    annotations = {"topology.scheduler/group": "sweep-7", "topology.scheduler/group-size": "2"}
    first = admit(operator_pod("a", {}, annotations, gpus=4), fresh_index)
    second = admit(operator_pod("b", {}, annotations, gpus=4), fresh_index)
    assert first.decision.request.pods == 2 and second.decision is first.decision
    assert fresh_index.stats().gpus_reserved == 8


def test_a_member_declaring_another_size_is_denied_naming_both_sizes(fresh_index):
    annotations = {"topology.scheduler/group": "sweep-8", "topology.scheduler/group-size": "2"}
    first = admit(operator_pod("a", {}, annotations, gpus=4), fresh_index)
    assert first.outcome == "placed"
    other = review(review_of(operator_pod("b", {}, {**annotations, "topology.scheduler/group-size": "3"}, gpus=4)),
                   fresh_index, Config())
    message = other.review["response"]["status"]["message"]
    assert other.outcome == "denied" and 'topology.scheduler/group-size="3"' in message
    assert "declares 3 pod(s) x 4 GPU(s)" in message and "placed for 2 pod(s) x 4 GPU(s)" in message
    honest = admit(operator_pod("c", {}, annotations, gpus=4), fresh_index)
    assert honest.outcome == "placed" and honest.decision is first.decision


def test_a_denied_first_member_does_not_decide_for_the_members_after_it(fresh_index):
    annotations = {"topology.scheduler/group": "sweep-9", "topology.scheduler/placement-strategy": "consolidated"}
    bad = review(review_of(operator_pod("a", {}, {**annotations, "topology.scheduler/preferred-domain": "nowhere",
                                                  "topology.scheduler/group-size": "2"})), fresh_index, Config())
    assert bad.outcome == "denied"
    honest = admit(operator_pod("b", {}, {**annotations, "topology.scheduler/group-size": "2"}), fresh_index)
    assert honest.outcome == "placed" and honest.decision.request.pods == 2


@pytest.mark.parametrize("annotations, fragment", [
    ({"topology.scheduler/group": "sweep", "topology.scheduler/group-size": "zero"},
     'topology.scheduler/group-size="zero" is not allowed; allowed: a whole number of pods from 1 to'),
    ({"topology.scheduler/group": "bad name!"}, 'topology.scheduler/group="bad name!" is not allowed'),
    ({"topology.scheduler/gpu-count": "30"}, "gpu-count=30 (the GPUs of all of PyTorchJob ml/bert) does not divide"),
])
def test_bad_group_annotations_are_denied_naming_annotation_value_and_what_is_allowed(annotations, fragment,
                                                                                       fresh_index):
    pod = pytorchjob_pods("bert")[0]
    pod["metadata"]["annotations"].update(annotations)
    result = review(review_of(pod), fresh_index, Config())
    assert result.outcome == "denied"
    assert fragment in result.review["response"]["status"]["message"]
    assert "Pod ml/bert-master-0" in result.review["response"]["status"]["message"]


def test_a_member_pod_reinvoked_with_our_own_output_is_left_as_it_is(fresh_index):
    placed = admit(pytorchjob_pods("bert")[0], fresh_index).admitted
    again = review(review_of(placed), fresh_index, Config())
    assert again.outcome == "ignored" and not again.patch


def test_bound_members_confirm_the_groups_hold_one_by_one(fresh_index):
    admitted = [admit(pod, fresh_index).admitted for pod in pytorchjob_pods("bert")]
    nodes = sorted(allowed_nodes(admitted[0]))
    for pod, node in zip(admitted[:2], nodes):
        bound = {**pod, "metadata": {**pod["metadata"], "uid": f"uid-{pod['metadata']['name']}"},
                 "spec": {**pod["spec"], "nodeName": node}, "status": {"phase": "Running"}}
        feed.upsert(fresh_index, bound, "Pod")
    stats = fresh_index.stats()
    assert stats.gpus_reserved == 16  # two pods bound (and counted as used), two still held


def child_jobs(jobset: dict) -> list[dict]:
    """The Jobs the JobSet controller creates from a (placed) JobSet: one per replica of each
    replicatedJob, the template copied, labelled and owned by the JobSet."""
    jobs = []
    name = jobset["metadata"]["name"]
    for replicated in jobset["spec"]["replicatedJobs"]:
        for i in range(replicated.get("replicas", 1)):
            labels = {"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": replicated["name"],
                      "jobset.sigs.k8s.io/job-index": str(i)}
            jobs.append({"apiVersion": "batch/v1", "kind": "Job",
                         "metadata": {"name": f"{name}-{replicated['name']}-{i}", "namespace": "ml", "labels": labels,
                                      "annotations": dict(jobset["metadata"].get("annotations") or {}),
                                      "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                                                           "name": name, "uid": "uid-js", "controller": True}]},
                         "spec": json.loads(json.dumps(replicated["template"]["spec"]))})
    return jobs


def jobset(name: str, gpus: int = 4) -> dict:
    job_template = {"parallelism": 2, "completions": 2, "template": {"spec": {
        "restartPolicy": "Never", "containers": [container(gpus=gpus)]}}}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "namespace": "ml",
                         "annotations": {"topology.scheduler/placement-strategy": "consolidated"}},
            "spec": {"replicatedJobs": [{"name": "workers", "replicas": 4, "template": {"spec": job_template}}]}}


@pytest.mark.parametrize("seed", range(3))
def test_a_jobsets_child_jobs_keep_its_one_leaf_in_any_order_and_a_second_jobset_gets_another(seed, fresh_index):
    # 4 replicas x 2 pods x 4 GPUs: the demo cluster's leaves hold 32 GPUs, so 8 pods of 8 GPUs
    # (64 GPUs) could not share one; the rule is the same at any size.
    placed = [admit(jobset(name), fresh_index).admitted for name in ("first", "second")]
    chosen = []
    for obj in placed:
        jobs = child_jobs(obj)
        random.Random(seed).shuffle(jobs)
        pods_leaves = set()
        for job in jobs:
            result = review(review_of(job), fresh_index, Config())
            assert result.outcome == "ignored" and not result.patch  # the JobSet's decision, not a new one
            pods_leaves.add(frozenset(leaves_allowed(job["spec"]["template"])))
        assert len(pods_leaves) == 1 and len(next(iter(pods_leaves))) == 1, pods_leaves
        chosen.append(next(iter(pods_leaves)))
    assert chosen[0] != chosen[1]
    assert fresh_index.stats().gpus_reserved == 64  # each JobSet held once, by its own key


def test_a_gpu_less_launcher_of_a_placed_group_is_pinned_with_it_and_holds_nothing(fresh_index):
    workers = [operator_pod(f"nccl-worker-{i}", {"training.kubeflow.org/job-name": "nccl"},
                            {"topology.scheduler/gpu-count": "16", "topology.scheduler/placement-strategy": "consolidated"},
                            owner=("MPIJob", "nccl")) for i in range(2)]
    launcher = operator_pod("nccl-launcher", {"training.kubeflow.org/job-name": "nccl"},
                            {"topology.scheduler/placement-strategy": "consolidated"}, gpus=0, owner=("MPIJob", "nccl"))
    early = admit(launcher, fresh_index)  # before any worker: nothing to join yet
    assert early.outcome == "ignored" and not early.patch
    placed = admit(workers[0], fresh_index).admitted
    result = admit(launcher, fresh_index)
    assert result.outcome == "placed" and leaves_allowed(result.admitted) == leaves_allowed(placed)
    assert fresh_index.stats().gpus_reserved == 16
    assert "env" not in result.admitted["spec"]["containers"][0]  # no NCCL settings for a container without GPUs


@pytest.mark.parametrize("seed", range(3))
def test_a_jobsets_child_jobs_arriving_alone_are_placed_as_one_group_in_any_order(seed, fresh_index):
    """The JobSet itself was not sent to the webhook (its API group not registered): its Jobs
    carry the JobSet's label and the job's total in gpu-count, and are grouped by them."""
    unplaced = jobset("solo")
    replicated = unplaced["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    replicated["metadata"] = {"labels": {"jobset.sigs.k8s.io/jobset-name": "solo"}, "annotations": {
        "topology.scheduler/gpu-count": "32", "topology.scheduler/placement-strategy": "consolidated"}}
    jobs = child_jobs(unplaced)
    random.Random(seed).shuffle(jobs)
    admitted = [admit(job, fresh_index) for job in jobs]
    assert [result.outcome for result in admitted] == ["placed"] * 4
    found = {frozenset(leaves_allowed(result.admitted["spec"]["template"])) for result in admitted}
    assert len(found) == 1 and len(next(iter(found))) == 1, found
    assert fresh_index.stats().gpus_reserved == 32  # one hold for the JobSet, not one per Job
    assert {r.admitted["spec"]["template"]["metadata"]["annotations"]["topology.scheduler/reservation"]
            for r in admitted} == {"ml/JobSet/solo"}


def test_a_pod_posing_as_a_member_of_a_placed_job_can_neither_take_nor_shrink_its_hold(fresh_index):
    job = review(review_of(workload("Job", name="victim", replicas=2, template_annotations={
        "topology.scheduler/placement-strategy": "consolidated"})), fresh_index, Config())
    assert job.outcome == "placed" and fresh_index.stats().gpus_reserved == 16
    # Kubeflow's label and a controlling owner of kind Job named like the victim: another group's key
    impostor = operator_pod("impostor", {"training.kubeflow.org/job-name": "victim"},
                            {"topology.scheduler/placement-strategy": "consolidated"}, gpus=1, owner=("Job", "victim"))
    result = review(review_of(impostor), fresh_index, Config())
    assert result.decision is None or result.decision.request.workload != "Job ml/victim"
    assert fresh_index.ledger.hold("ml/Job/victim").pods == 2
    # Naming a group's key outright (a Kubeflow owner) with a smaller size is denied, also where
    # only the group's hold is known (a replica that saw the claim, not the first member).
    members = {"training.kubeflow.org/job-name": "bert"}
    first = admit(operator_pod("bert-master-0", members, {"topology.scheduler/group-size": "2"},
                               owner=("PyTorchJob", "bert")), fresh_index)
    assert first.outcome == "placed"
    fresh_index.ledger.groups.clear()
    fake = operator_pod("fake", members, {"topology.scheduler/group-size": "1"}, owner=("PyTorchJob", "bert"))
    denied = review(review_of(fake), fresh_index, Config())
    assert denied.outcome == "denied" and "placed for 2 pod(s)" in denied.review["response"]["status"]["message"]
    assert fresh_index.ledger.hold("ml/PyTorchJob/bert").pods == 2
