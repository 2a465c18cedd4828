"""The releaser against the fake apiserver, through the real client: gated waits start when room
opens in their domain or one no wider, each pod patched once, as the apiserver lets a gated pod
change (tests/integration/fakeapiserver.py refuses any other change of its spec).
"""
from __future__ import annotations

import base64
import json
import time

import jsonpatch
import pytest

from conftest import LEAF, eventually
from tests.fixtures.builders import workload
from webhook.objects.kinds import BY_KEY
from webhook.settings.config import Config
from webhook.core.injection import GATE, GATED_REQUEST, PLACEMENT, WAITING_FOR
from webhook.kube.demo import make_node, make_pod
from webhook import admission
from webhook.objects.templates import pod_template

GATED = Config(gate_waits=True)
ZONE, SPINE = "topology.kubernetes.io/zone", "topology.scheduler/spine"


def cluster(fake, zones=1, spines=2, nodes=2):
    """Zones of spines of one leaf each, every node full: one 8-GPU pod on each. A 2-node job
    waits in the spine that fits first (the cost model gives it the same bandwidth there as in
    one leaf) and never across zones (that stretches its run more than the wait it saves)."""
    for z in range(zones):
        for s in range(spines):
            for n in range(nodes):
                name = f"gpu-z{z}-s{s}-n{n}"
                fake.put_node(make_node(name, {ZONE: f"zone-{z}", SPINE: f"spine-{z}-{s}", LEAF: f"leaf-{z}-{s}"}))
                fake.put_pod(make_pod(f"busy-{name}", name, 8))


def gated_job(fake, view, name="train", pods=2, stored=True):
    """A 2x8-GPU consolidated Job admitted while nothing is free, stored in the API (unless not
    `stored`), and the pods its controller makes."""
    job = workload("Job", name=name, replicas=pods, annotations={"topology.scheduler/placement-strategy": "consolidated"})
    result = admission.review(admission.make_review(job), view.index, view.config)
    assert result.outcome == "waiting", result.outcome
    patch = json.loads(base64.b64decode(result.review["response"]["patch"]))
    admitted = {**jsonpatch.apply_patch(job, patch), "status": {}}
    admitted["metadata"].update(namespace="ml", uid=f"uid-job-{name}")
    if stored:
        fake.put("jobs", admitted)
    template = pod_template(BY_KEY["Job"], admitted)
    assert {"name": GATE} in template["spec"]["schedulingGates"]
    return owned([{"apiVersion": "v1", "kind": "Pod",
                   "metadata": {**json.loads(json.dumps(template["metadata"])), "name": f"{name}-{i}",
                                "namespace": "ml", "uid": f"uid-{name}-{i}"},
                   "spec": json.loads(json.dumps(template["spec"])), "status": {"phase": "Pending"}}
                  for i in range(pods)], admitted)


def stored(fake, name):
    return fake.get("pods", f"ml/{name}")


def released(fake, name):
    pod = stored(fake, name)
    return pod if not pod["spec"].get("schedulingGates") else None


def leaf_pinned(pod):
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return {value for term in terms for e in term["matchExpressions"] if e["key"] == LEAF for value in e["values"]}


def test_a_gated_job_starts_in_an_equal_domain_that_frees_first(fake, make_view):
    cluster(fake, zones=2, spines=1)
    results = []
    view = make_view(fake, GATED, on_release=results.append, release_interval_seconds=0.05)
    view.start()
    assert view.wait_synced(15)
    pods = gated_job(fake, view)
    waited = pods[0]["metadata"]["annotations"][WAITING_FOR]
    for pod in pods:
        fake.put_pod(pod)
    eventually(lambda: len(view.index.pods.gated) == 2, what="both pods seen gated")
    assert waited.endswith("spine=spine-0-0")  # the first of equal spines fits first
    fake.delete("pods", "default/busy-gpu-z1-s0-n0")
    fake.delete("pods", "default/busy-gpu-z1-s0-n1")
    first, second = (eventually(lambda: released(fake, pod["metadata"]["name"]), what="released") for pod in pods)
    assert leaf_pinned(first) == leaf_pinned(second) == {"leaf-1-0"}  # not the spine it waited in: this one freed first
    annotations = first["metadata"]["annotations"]
    assert WAITING_FOR not in annotations and GATED_REQUEST not in annotations
    assert "behind its scheduling gate" not in annotations[PLACEMENT]  # the summary says where, not why
    eventually(lambda: results, what="the release counted")  # counted once its last patch is answered
    assert results == ["released"]
    eventually(lambda: len(view.index.pods.gated) == 0, what="the index no longer counts them gated")


def test_a_gated_job_waits_while_only_a_wider_span_has_room(fake, make_view):
    cluster(fake, zones=2, spines=1)
    view = make_view(fake, GATED, release_interval_seconds=0.05)
    view.start()
    assert view.wait_synced(15)
    pods = gated_job(fake, view)
    for pod in pods:
        fake.put_pod(pod)
    eventually(lambda: len(view.index.pods.gated) == 2, what="both pods seen gated")
    fake.delete("pods", "default/busy-gpu-z0-s0-n0")  # one node free in each zone: only both would hold it
    fake.delete("pods", "default/busy-gpu-z1-s0-n0")
    eventually(lambda: view.index.stats().gpus_used == 16, what="the frees seen")
    changes = view.index.changes
    eventually(lambda: view.releaser.seen_changes == changes, what="a pass after the frees")
    assert all(stored(fake, pod["metadata"]["name"])["spec"]["schedulingGates"] == [{"name": GATE}] for pod in pods)


def test_two_replicas_release_a_workload_once(fake, make_view):
    cluster(fake)
    results = []
    views = [make_view(fake, GATED, on_release=results.append, release_interval_seconds=0.01) for _ in range(2)]
    for view in views:
        view.start()
        assert view.wait_synced(15)
    pods = gated_job(fake, views[0])
    for pod in pods:
        fake.put_pod(pod)
    for view in views:
        eventually(lambda: len(view.index.pods.gated) == 2, what="both pods seen gated by both replicas")
    for spine in range(2):
        for node in range(2):
            fake.delete("pods", f"default/busy-gpu-z0-s{spine}-n{node}")
    first, second = (eventually(lambda: released(fake, pod["metadata"]["name"]), what="released") for pod in pods)
    assert leaf_pinned(first) == leaf_pinned(second)
    eventually(lambda: all(len(view.index.pods.gated) == 0 for view in views), what="both replicas see them released")
    # the watch can bring the released pods before the releasing thread has counted its release
    eventually(lambda: results.count("released") == 1, what="the release counted")
    assert results.count("released") == 1 and "failed" not in results, results


def test_the_fake_apiserver_refuses_what_the_apiserver_refuses_on_a_gated_pod(fake, make_view):
    """The releaser's patches pass only because they are what the API allows: widening or
    replacing a gated pod's pin, or touching its containers, is refused."""
    cluster(fake)
    view = make_view(fake, GATED)
    view.start()
    assert view.wait_synced(15)
    pod = gated_job(fake, view)[0]
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": LEAF, "operator": "In", "values": ["leaf-0-0"]}]}]}}}
    fake.put_pod(pod)
    path = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0/matchExpressions"
    for operations in ([{"op": "replace", "path": path + "/0/values", "value": ["leaf-0-1"]}],
                       [{"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "A", "value": "1"}]}],
                       [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": "x"}}]):
        assert fake._patch("pods", "ml/train-0", operations)[0] == 422, operations
    narrower = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-z0-s0-n0"]}
    assert fake._patch("pods", "ml/train-0", [{"op": "add", "path": path + "/-", "value": narrower},
                                             {"op": "remove", "path": "/spec/schedulingGates/0"}])[0] == 200
    assert fake._patch("pods", "ml/train-0", [{"op": "add", "path": path + "/-", "value": narrower}])[0] == 422


# -- the gate path under a hostile tenant, scaling and replicas (issue 37) ---------------------------

def test_one_edited_gated_pod_stops_no_other_release_and_is_reported(fake, make_view):
    cluster(fake, zones=1, spines=2)
    results = []
    view = make_view(fake, GATED, on_release=results.append, release_interval_seconds=0.05)
    view.start()
    assert view.wait_synced(15)
    victim = gated_job(fake, view, "victim")
    for name, request in (("zero", '{"pods": 0}'), ("text", '"two"'), ("negative", None)):
        pod = gated_job(fake, view, name)[0]
        annotations = pod["metadata"]["annotations"]
        if request is None:  # a request of its own, consistent but with negative GPUs
            request = annotations[GATED_REQUEST].replace('"gpus_per_pod":8', '"gpus_per_pod":-8')
        annotations[GATED_REQUEST] = request  # the pod's owner edits it: pod UPDATEs never pass the webhook
        fake.put_pod(pod)
    for pod in victim:
        fake.put_pod(pod)
    eventually(lambda: len(view.index.pods.gated) == 2 and len(view.index.pods.gated.refused) == 3, what="all seen")
    for spine in range(2):
        for node in range(2):
            fake.delete("pods", f"default/busy-gpu-z0-s{spine}-n{node}")
    for pod in victim:
        eventually(lambda: released(fake, pod["metadata"]["name"]), what="the other workload released")
    for name in ("zero-0", "text-0", "negative-0"):
        assert stored(fake, name)["spec"]["schedulingGates"] == [{"name": GATE}]
    eventually(lambda: results.count("refused") == 3, what="each refused pod counted once")

    def named() -> list[str]:  # each is counted just before its Event is posted
        events = list(fake._objects["events"].values())
        return sorted(e[0]["involvedObject"]["name"] for e in events if e[0]["reason"] == "GateRecordRefused")
    eventually(lambda: named() == ["negative-0", "text-0", "zero-0"], what="each refused pod named in an Event")
    assert results.count("refused") == 3, "and counted once"


def test_a_pod_of_another_namespace_neither_takes_nor_steers_a_gated_workload(fake, make_view):
    cluster(fake, zones=1, spines=2)
    view = make_view(fake, GATED, release_interval_seconds=0.05)
    view.start()
    assert view.wait_synced(15)
    victim = gated_job(fake, view, "victim")
    thief = gated_job(fake, view, "aaa")[0]  # sorts before the victim's pods
    thief["metadata"]["namespace"] = "team-a"
    for form in ("copied", "own-request"):
        pod = json.loads(json.dumps(thief))
        pod["metadata"].update(name=f"thief-{form}", uid=f"uid-thief-{form}")
        annotations = pod["metadata"]["annotations"]
        annotations["topology.scheduler/reservation"] = "ml/Job/victim"
        if form == "copied":  # the victim's record, seal and all
            annotations.update({k: v for k, v in victim[0]["metadata"]["annotations"].items()
                                if k.startswith("topology.scheduler/")})
        fake.put_pod(pod)
    for pod in victim:
        fake.put_pod(pod)
    eventually(lambda: len(view.index.pods.gated) == 2 and len(view.index.pods.gated.refused) == 2, what="all seen")
    assert not view.index.ledger.hold("ml/Job/victim")
    for spine in range(2):
        for node in range(2):
            fake.delete("pods", f"default/busy-gpu-z0-s{spine}-n{node}")
    first, second = (eventually(lambda: released(fake, pod["metadata"]["name"]), what="released") for pod in victim)
    assert "2 pod(s) x 8" in first["metadata"]["annotations"][PLACEMENT]  # decided from its own request
    assert leaf_pinned(first) == leaf_pinned(second)
    for form in ("copied", "own-request"):
        assert fake.get("pods", f"team-a/thief-{form}")["spec"]["schedulingGates"] == [{"name": GATE}]


def owned(pods, job):
    for pod in pods:
        pod["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"]["name"],
                                               "uid": job["metadata"]["uid"], "controller": True}]
    return pods


@pytest.mark.parametrize("before, after", [(2, 3), (2, 1)])
@pytest.mark.parametrize("owner", ["read", "unknown"])
def test_a_job_scaled_while_gated_is_released_at_its_new_size(fake, make_view, before, after, owner):
    """Its owner says how many pods it wants; without one to read, what its pods say does (more
    pods made than decided, or fewer after some were deleted while gated)."""
    cluster(fake, zones=1, spines=2)
    view = make_view(fake, GATED, release_interval_seconds=0.05)
    view.start()
    assert view.wait_synced(15)
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": "ml", "uid": "job-uid"},
           "spec": {"parallelism": after, "completions": after}, "status": {}}
    pods = owned(gated_job(fake, view, pods=before, stored=False), job)
    if owner == "read":
        fake.put("jobs", job)
    else:
        fake.forbidden.add("jobs")  # the chart's RBAC lets it read Jobs; a narrower one may not
    if after > before:
        extra = json.loads(json.dumps(pods[-1]))
        extra["metadata"].update(name="train-9", uid="uid-train-9")
        pods.append(extra)  # the Job controller's new pod, from the same (gated) template
    for pod in pods:
        fake.put_pod(pod)
    eventually(lambda: len(view.index.pods.gated) == len(pods), what="the pods seen gated")
    for pod in pods[after:]:  # scaled down: the Job controller deletes the pods left over
        fake.delete("pods", f"ml/{pod['metadata']['name']}")
    eventually(lambda: len(view.index.pods.gated) == after, what="the pods left seen gated")
    for spine in range(2):
        for node in range(2):
            fake.delete("pods", f"default/busy-gpu-z0-s{spine}-n{node}")
    for pod in pods[:after]:
        eventually(lambda: released(fake, pod["metadata"]["name"]), what=f"all {after} released")


@pytest.mark.parametrize("replicas", [2, 3])
def test_replicas_sharing_claims_release_no_more_than_the_room(fake, make_view, replicas):
    cluster(fake, zones=1, spines=4, nodes=2)
    results = []
    views = [make_view(fake, GATED, claims_namespace="topology-system", on_release=results.append,
                       release_interval_seconds=0.01) for _ in range(replicas)]
    for view in views:
        view.start()
        assert view.wait_synced(15)
    jobs = [gated_job(fake, views[0], f"job-{i:02}") for i in range(12)]
    for pods in jobs:
        for pod in pods:
            fake.put_pod(pod)
    for view in views:
        eventually(lambda: len(view.index.pods.gated) == 24, what="every pod seen gated by every replica")
    for spine in range(2):  # room for 2 jobs of 2x8: 4 nodes, in 2 leaves
        for node in range(2):
            fake.delete("pods", f"default/busy-gpu-z0-s{spine}-n{node}")
    eventually(lambda: results.count("released") >= 2, what="the room filled")
    time.sleep(1.0)  # further passes of every replica: none may release more
    out = [stored(fake, pod["metadata"]["name"]) for pods in jobs for pod in pods]
    free = {f"leaf-0-{s}" for s in range(2)}
    started = [pod for pod in out if not pod["spec"].get("schedulingGates")]
    assert len(started) == 4, [p["metadata"]["name"] for p in started]
    per_leaf = {}
    for pod in started:
        (leaf,) = leaf_pinned(pod)
        per_leaf[leaf] = per_leaf.get(leaf, 0) + 1
    assert set(per_leaf) <= free and all(count <= 2 for count in per_leaf.values()), per_leaf


def test_a_release_the_api_refuses_is_left_and_the_pass_goes_on(fake, make_view):
    """A pod whose release the apiserver refuses (its owner edited its record so the patch would
    touch what the API does not let change, say) stops nothing: the next workload is released."""
    cluster(fake, zones=1, spines=2)
    results = []
    view = make_view(fake, GATED, on_release=results.append, release_interval_seconds=0.05)
    view.start()
    assert view.wait_synced(15)
    first, second = gated_job(fake, view, "aaa-first"), gated_job(fake, view, "zzz-second")
    for pods in (first, second):
        for pod in pods:
            fake.put_pod(pod)
    eventually(lambda: len(view.index.pods.gated) == 4, what="all seen gated")
    refused = {f"ml/{p['metadata']['name']}" for p in first}
    patch = fake._patch

    def refusing(kind, key, operations):  # the apiserver refuses the first workload's pods
        if key in refused:
            return 422, {"kind": "Status", "code": 422, "reason": "Invalid", "message": "refused"}
        return patch(kind, key, operations)
    fake._patch = refusing
    for spine in range(2):
        for node in range(2):
            fake.delete("pods", f"default/busy-gpu-z0-s{spine}-n{node}")
    for pod in second:
        eventually(lambda: released(fake, pod["metadata"]["name"]), what="the second workload released")
    assert all(stored(fake, p["metadata"]["name"])["spec"]["schedulingGates"] == [{"name": GATE}] for p in first)
    assert "failed" in results and "released-by-another-replica" not in results


def free_everything(fake, spines=2, nodes=2):
    for spine in range(spines):
        for node in range(nodes):
            fake.delete("pods", f"default/busy-gpu-z0-s{spine}-n{node}")


@pytest.mark.parametrize("change", ["deleted", "suspended", "scaled to 0"])
def test_a_gated_job_whose_owner_went_away_is_not_released_when_room_opens(fake, make_view, change):
    """Asked once a pass before any release: a Job deleted, suspended or wanting no pods gets none
    started (its pods, gone soon, would hold their room for nothing)."""
    cluster(fake, zones=1, spines=2)
    view = make_view(fake, GATED, release_interval_seconds=0.05)
    view.start()
    assert view.wait_synced(15)
    pods = gated_job(fake, view)
    stored_job = fake.get("jobs", "ml/train")
    if change == "deleted":
        fake.delete("jobs", "ml/train")
    else:
        stored_job["spec"].update({"suspend": True} if change == "suspended" else {"parallelism": 0})
        fake.put("jobs", stored_job)
    for pod in pods:
        fake.put_pod(pod)
    eventually(lambda: len(view.index.pods.gated) == 2, what="both pods seen gated")
    free_everything(fake)
    other = gated_job(fake, view, "other")  # a workload still wanted is released: the passes ran
    for pod in other:
        fake.put_pod(pod)
    eventually(lambda: all(released(fake, pod["metadata"]["name"]) for pod in other), what="the other released")
    assert all(stored(fake, pod["metadata"]["name"])["spec"]["schedulingGates"] for pod in pods)
    assert view.index.ledger.hold("ml/Job/train") is None


def test_a_job_created_again_under_its_name_starts_once_the_old_ones_pods_are_gone(fake, make_view):
    """Helm's before-hook-creation, `kubectl replace --force`: the old Job is deleted while its pods
    are gated and a new one takes its name; the garbage collector deletes the old pods later."""
    cluster(fake, zones=1, spines=2)
    view = make_view(fake, GATED, release_interval_seconds=0.05)
    view.start()
    assert view.wait_synced(15)
    old = gated_job(fake, view)
    for pod in old:
        fake.put_pod(pod)
    eventually(lambda: len(view.index.pods.gated) == 2, what="the old pods seen gated")
    fake.delete("jobs", "ml/train")
    new = gated_job(fake, view)
    for pod in new:
        pod["metadata"]["ownerReferences"][0]["uid"] = "uid-job-train-again"
        pod["metadata"].update(name=pod["metadata"]["name"] + "-again", uid=pod["metadata"]["uid"] + "-again")
    job = fake.get("jobs", "ml/train")
    fake.put("jobs", {**job, "metadata": {**job["metadata"], "uid": "uid-job-train-again"}})
    for pod in new:
        fake.put_pod(pod)
    for pod in old:  # the garbage collector
        fake.delete("pods", f"ml/{pod['metadata']['name']}")
    free_everything(fake)
    for pod in new:
        eventually(lambda: released(fake, pod["metadata"]["name"]), what="the new Job's pods released")
