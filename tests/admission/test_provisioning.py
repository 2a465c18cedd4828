"""ProvisioningRequests for groups that wait for nodes (opt-in `provisioning_request_class`): made
once per workload with a PodTemplate of its pods, consumed by its pods only once they exist, never
for Karpenter, deleted with the workload; over the API, idempotent and never fatal."""
from __future__ import annotations

import gzip
import json
import pathlib

import jsonschema
from conftest import assert_valid_kubernetes_object, review_of

from tests.fixtures.builders import gpu_job
from tests.fixtures.shared import GPU_TOLERATION, NODEPOOL, deletion, karpenter_nodes, pytorchjob_pods
from webhook.objects.kinds import BY_KEY, kind_of_object
from webhook.objects.feed import index_of
from webhook.state.index import ClusterIndex
from webhook.settings.config import Config
from webhook.kube.demo import demo_cluster
from webhook.kube.scaleups import ApiScaleUps
from webhook.objects import provisioning
from webhook.admission import make_review, review
from webhook.objects.templates import pod_template

ATOMIC = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
CONFIG = Config(provisioning_request_class=ATOMIC)
SCHEMA = json.loads(gzip.decompress((pathlib.Path(__file__).parents[1] / "fixtures" / "crds" /
                                     "autoscaling.x-k8s.io_v1_ProvisioningRequest.json.gz").read_bytes()))


class Recorded:
    """A ScaleUps that keeps what it was asked, and answers `problem` to every create."""

    def __init__(self, problem: str | None = None) -> None:
        self.problem = problem
        self.created: list[tuple] = []
        self.deleted: list[tuple[str, str]] = []

    def create(self, objects):
        self.created.append(tuple(objects))
        return self.problem

    def delete(self, namespace, name):
        self.deleted.append((namespace, name))


def demo_index(config: Config = CONFIG, scale_ups=None) -> ClusterIndex:
    index = index_of(config, *demo_cluster())
    index.scale_ups = scale_ups
    return index


def annotations(obj: dict) -> dict:
    return pod_template(kind_of_object(obj), obj)["metadata"].get("annotations") or {}


def test_a_job_larger_than_the_cluster_gets_one_provisioning_request_its_pods_consume():
    scale_ups = Recorded()
    job = gpu_job("big", 40, 8, placement_strategy="consolidated")
    result = review(review_of(job), demo_index(scale_ups=scale_ups), CONFIG)
    assert result.outcome == "waiting-for-nodes"
    ((pod_template_obj, request),) = scale_ups.created
    name = provisioning.request_name("ml/Job/big")
    assert request["metadata"] == pod_template_obj["metadata"] == {
        "name": name, "namespace": "ml", "labels": {"app.kubernetes.io/managed-by": "topology-webhook"}}
    assert request["spec"] == {"provisioningClassName": ATOMIC, "podSets": [{"podTemplateRef": {"name": name},
                                                                             "count": 40}]}
    jsonschema.validate(request, SCHEMA)
    assert_valid_kubernetes_object(pod_template_obj)
    assert pod_template_obj["template"]["spec"] == pod_template(BY_KEY["Job"], result.admitted)["spec"]  # as the pods
    admitted = annotations(result.admitted)
    assert admitted[provisioning.CONSUME] == name and admitted[provisioning.CLASS] == ATOMIC
    assert admitted["topology.scheduler/placement"].endswith(f"; ProvisioningRequest {name} ({ATOMIC})")
    assert any(f"ProvisioningRequest ml/{name}" in w for w in result.warnings)
    assert_valid_kubernetes_object(result.admitted)
    # Its key on the Job itself, for the watch to delete these when it sees the Job deleted
    # (tests/kube/test_clusterview.py); a DELETE review deletes nothing.
    assert result.admitted["metadata"]["annotations"]["topology.scheduler/reservation"] == "ml/Job/big"
    assert review(deletion(result.admitted), demo_index(scale_ups=scale_ups), CONFIG).outcome == "ignored"
    assert scale_ups.deleted == []


def test_a_request_that_cannot_be_made_leaves_the_pods_to_an_ordinary_scale_up():
    scale_ups = Recorded(problem="the API autoscaling.x-k8s.io/v1 is not served")
    job = gpu_job("big", 40, 8, placement_strategy="consolidated")
    result = review(review_of(job), demo_index(scale_ups=scale_ups), CONFIG)
    assert result.outcome == "waiting-for-nodes" and len(scale_ups.created) == 1
    assert provisioning.CONSUME not in annotations(result.admitted)
    assert any("no ProvisioningRequest (the API autoscaling.x-k8s.io/v1 is not served)" in w for w in result.warnings)


def test_no_request_for_a_dry_run_one_pod_a_placed_job_karpenter_or_without_a_class():
    scale_ups = Recorded()
    big = gpu_job("big", 40, 8, placement_strategy="consolidated")
    review(make_review(big, dry_run=True), demo_index(scale_ups=scale_ups), CONFIG)
    review(review_of(gpu_job("one", 1, 8, placement_strategy="consolidated")), demo_index(scale_ups=scale_ups), CONFIG)  # single pods need no atomicity
    review(review_of(gpu_job("fits", 4, 8, placement_strategy="consolidated")), demo_index(scale_ups=scale_ups), CONFIG)
    review(review_of(big), demo_index(Config(), scale_ups), Config())
    karpenter = index_of(CONFIG, [*karpenter_nodes(), NODEPOOL])
    karpenter.scale_ups = scale_ups
    job = gpu_job("grow", 6, 8, placement_strategy="consolidated")
    job["spec"]["template"]["spec"]["tolerations"] = GPU_TOLERATION
    assert review(review_of(job), karpenter, CONFIG).outcome == "waiting-for-growth"
    assert scale_ups.created == []


def test_a_stale_consumption_of_ours_is_dropped_when_placed_again_and_a_queue_s_own_is_never_touched():
    job = gpu_job("again", 4, 8, placement_strategy="consolidated")
    job["spec"]["template"]["metadata"]["annotations"] = {provisioning.CONSUME: provisioning.request_name("x"),
                                                          provisioning.CLASS: ATOMIC}
    result = review(review_of(job), demo_index(scale_ups=Recorded()), CONFIG)
    assert result.outcome == "placed" and provisioning.CONSUME not in annotations(result.admitted)
    assert provisioning.CLASS not in annotations(result.admitted)


def test_a_queue_s_own_consume_annotation_is_never_touched():
    job = gpu_job("queued", 4, 8, placement_strategy="consolidated")
    job["spec"]["template"]["metadata"]["annotations"] = {provisioning.CONSUME: "kueue-made", provisioning.CLASS: ATOMIC}
    result = review(review_of(job), demo_index(scale_ups=Recorded()), CONFIG)
    assert result.outcome == "placed"
    assert annotations(result.admitted)[provisioning.CONSUME] == "kueue-made"


def test_a_pod_group_larger_than_the_cluster_gets_one_request_owned_by_its_operator_s_object():
    scale_ups = Recorded()
    index = demo_index(scale_ups=scale_ups)
    pods = pytorchjob_pods("huge", workers=40)  # 41 pods x 8 GPUs on 32 nodes of 8
    results = [review(review_of(pod), index, CONFIG) for pod in pods]
    assert {r.outcome for r in results} == {"waiting-for-nodes"}
    names = {request["metadata"]["name"] for _, request in scale_ups.created}
    assert len(names) == 1 and len(scale_ups.created) == len(pods)  # one request, asked for again by each member
    _, request = scale_ups.created[0]
    assert request["spec"]["podSets"][0]["count"] == 41
    (owner,) = request["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("PyTorchJob", "huge") and owner["uid"]
    jsonschema.validate(request, SCHEMA)
    assert {annotations(r.admitted)[provisioning.CONSUME] for r in results} == names


# -- over the API ---------------------------------------------------------------------------------------

def test_over_the_api_created_once_found_again_and_deleted(fake, make_view):
    fake.serve_provisioning_requests = True
    counted: list[str] = []
    view = make_view(fake, CONFIG, on_scale_up=counted.append)
    assert isinstance(view.index.scale_ups, ApiScaleUps)
    pod_template_obj, request = provisioning.request_objects("ml", "topology-x", {"spec": {"containers": []}}, 3,
                                                             ATOMIC)
    assert view.index.scale_ups.create((pod_template_obj, request)) is None
    assert view.index.scale_ups.create((pod_template_obj, request)) is None  # a member of the same group
    assert fake.get("provisioningrequests", "ml/topology-x")["spec"]["podSets"][0]["count"] == 3
    assert fake.get("podtemplates", "ml/topology-x")["template"]["spec"] == {"containers": []}
    view.index.scale_ups.delete("ml", "topology-x")
    view.index.scale_ups.delete("ml", "topology-x")  # gone already: nothing to do
    assert counted == ["created", "exists", "deleted", "deleted"]
    assert not fake._objects["provisioningrequests"] and not fake._objects["podtemplates"]


def test_over_the_api_a_cluster_without_the_crd_keeps_no_pod_template(fake, make_view):
    counted: list[str] = []
    view = make_view(fake, CONFIG, on_scale_up=counted.append)
    objects = provisioning.request_objects("ml", "topology-y", {"spec": {"containers": []}}, 3, ATOMIC)
    assert view.index.scale_ups.create(objects) == "the API autoscaling.x-k8s.io/v1 is not served"
    assert counted == ["not-served"] and not fake._objects["podtemplates"]
    fake.forbidden = {"podtemplates"}  # the chart's RBAC without provisioning_request_class
    assert view.index.scale_ups.create(objects).startswith("HTTP 403")
    assert counted == ["not-served", "failed"]
