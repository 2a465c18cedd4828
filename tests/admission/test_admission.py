import base64
import json
import logging
import re

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures.builders import (container, deep, gpu_job, load_json, schema_error, seed_manifests, template_of,
                                     valid, workload)
from tests.fixtures.shared import deletion
from webhook import admission
from webhook.kube.demo import demo_cluster, leaf_spine_nodes, make_pod
from webhook.objects import feed, mutation
from webhook.objects.feed import index_of
from webhook.settings.config import Config
from webhook.state.index import ClusterIndex

CONFIG = Config()
AUDIT_KEY = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


@pytest.fixture
def index() -> ClusterIndex:
    return index_of(CONFIG, *demo_cluster())


def run(obj_or_review: dict, index: ClusterIndex, config: Config = CONFIG, **review_args) -> admission.AdmissionResult:
    body = obj_or_review if obj_or_review.get("kind") == "AdmissionReview" else admission.make_review(
        obj_or_review, **review_args)
    result = admission.review(body, index, config)
    check_envelope(body, result)
    return result


def check_envelope(body: dict, result: admission.AdmissionResult) -> None:
    """What the apiserver verifies on every response, plus our own limits on warnings."""
    review = result.review
    response = review["response"]
    assert review["apiVersion"] == body["apiVersion"] and review["kind"] == "AdmissionReview"
    assert response["uid"] == body["request"]["uid"] == result.uid
    assert isinstance(response["allowed"], bool)
    assert ("patch" in response) == ("patchType" in response)
    assert response.get("patchType", "JSONPatch") == "JSONPatch"
    for warning in response.get("warnings", []):
        assert len(warning) <= 256 and not re.search(r"[\x00-\x1f\x7f]", warning)
    assert all(AUDIT_KEY.fullmatch(key) for key in response.get("auditAnnotations", {}))
    assert response["allowed"] or response["status"]["code"] == 403
    json.dumps(review)  # the app serializes it as it is


def patched(body_or_obj: dict, result: admission.AdmissionResult) -> dict:
    """The object the apiserver stores: the patch decoded and applied to exactly what was sent."""
    obj = body_or_obj["request"]["object"] if body_or_obj.get("kind") == "AdmissionReview" else body_or_obj
    response = result.review["response"]
    if "patch" not in response:
        return obj
    operations = json.loads(base64.b64decode(response["patch"]))
    return jsonpatch.apply_patch(obj, operations)


# -- the envelope --------------------------------------------------------------------------------

@pytest.mark.parametrize("body, fragment", [
    pytest.param([], "JSON list", id="a list"),
    pytest.param("review", "JSON str", id="a string"),
    pytest.param({}, "kind is None", id="empty object"),
    pytest.param({"kind": "Pod", "apiVersion": "v1"}, 'kind is "Pod"', id="not a review"),
    pytest.param({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v2", "request": {"uid": "u"}},
                 'apiVersion "admission.k8s.io/v2"', id="unknown review version"),
    pytest.param({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}, "request is missing",
                 id="no request"),
    pytest.param({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"operation": "CREATE"}},
                 "request.uid", id="no uid"),
    pytest.param({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1",
                  "request": {"uid": "u", "operation": "CREATE", "object": None}}, "request.object", id="no object"),
])
def test_a_body_that_is_not_a_review_is_malformed(body, fragment, index):
    with pytest.raises(admission.MalformedReview) as err:
        admission.review(body, index, CONFIG)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_the_contract_sample_is_allowed_unmodified(index):
    body = load_json("review-sample-v1.json")  # kind "kindValue", operation "operationValue"
    result = run(body, index)
    assert result.outcome == "ignored"
    assert result.review == {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                             "response": {"uid": "uidValue", "allowed": True}}
    assert (result.kind, result.namespace, result.name) == ("kindValue", "namespaceValue", "nameValue")


def test_a_v1beta1_review_is_answered_in_v1beta1(index):
    body = load_json("review-generatename-pod-v1beta1.json")
    result = run(body, index)
    assert result.review["apiVersion"] == "admission.k8s.io/v1beta1"
    assert result.outcome == "placed" and result.name == "notebook-"
    pod = valid(patched(body, result))
    assert pod["metadata"]["annotations"][mutation.RESERVATION] == "research/Pod/notebook-" + body["request"]["uid"]


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE", "CONNECT"])
def test_operations_we_do_not_mutate_are_allowed_unmodified(operation, index):
    body = admission.make_review(workload("Job", annotations={"topology.scheduler/gpu-count": "8"}),
                                 operation=operation)
    if operation != "UPDATE":
        body["request"]["object"] = None
    result = run(body, index)
    assert result.outcome == "ignored" and "patch" not in result.review["response"]


# -- the seeds' manifests --------------------------------------------------------------------------

SEED_OUTCOMES = {
    "002-single-gpu-job#0": "placed", "002-multi-gpu-job#0": "placed", "002-gpu-job#0": "placed",
    "002-gpu-inference-service#0": "placed", "002-multi-node-training#0": "denied",
}


@pytest.mark.parametrize("name, obj", seed_manifests(), ids=[n for n, _ in seed_manifests()])
def test_every_seed_manifest(name, obj, index):
    result = run(obj, index)
    assert result.outcome == SEED_OUTCOMES.get(name, "ignored")
    if result.outcome != "placed":
        assert "patch" not in result.review["response"]
        return
    out = patched(obj, result)
    # some seeds are loose (a Deployment without selector): the patch must add no error of its own
    assert schema_error(out) == schema_error(obj)
    assert template_of(out)["spec"]["schedulerName"] == "default-scheduler"
    assert mutation.PLACEMENT in template_of(out)["metadata"]["annotations"]
    again = run(out, index)  # reinvocation: our own output comes back
    assert again.outcome == "ignored" and "patch" not in again.review["response"]  # not placed again


def test_seed_preferred_leaf_is_honoured(index):
    obj = dict(seed_manifests())["002-multi-gpu-job#0"]
    result = run(obj, index)
    assert result.decision.scope.path[2] == ("topology.scheduler/leaf", "leaf-1")
    assert result.decision.preferred_honoured is True


def test_seed_multi_node_training_without_template_is_denied_clearly(index):
    obj = dict(seed_manifests())["002-multi-node-training#0"]
    message = run(obj, index).review["response"]["status"]["message"]
    assert message == ("Job default/multi-node-training: spec.template.spec is missing; "
                       "a pod spec with containers is required to place it")


def test_seed_multi_node_training_with_a_template_is_pinned_in_spine_1(index):
    obj = deep(dict(seed_manifests())["002-multi-node-training#0"])
    obj["spec"]["template"] = {"spec": {"restartPolicy": "Never", "containers": [container(gpus=4)]}}
    result = run(obj, index)
    assert result.outcome == "placed" and result.strategy == "consolidated"
    assert result.decision.request.pods == 4 and result.decision.request.min_bandwidth_gbps == 200.0
    out = valid(patched(obj, result))
    terms = template_of(out)["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    pinned = {e["key"]: e["values"] for e in terms["nodeSelectorTerms"][0]["matchExpressions"]}
    assert pinned["topology.scheduler/spine"] == ["spine-1"]


# -- fixtures with existing settings --------------------------------------------------------------------

def test_existing_affinity_spread_env_and_annotations_are_kept(index):
    body = load_json("review-deployment-existing-settings.json")
    sent = deep(body["request"]["object"])
    result = run(body, index)
    assert result.outcome == "placed" and result.strategy == "distributed"
    out = valid(patched(body, result))
    spec, meta = template_of(out)["spec"], template_of(out)["metadata"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert len(terms) == 2  # added to both ORed terms, no third term
    for term, original in zip(terms, template_of(sent)["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]):
        assert term["matchExpressions"][0] == original["matchExpressions"][0] and len(term["matchExpressions"]) > 1
    pairs = [(c["topologyKey"], c["whenUnsatisfiable"]) for c in spec["topologySpreadConstraints"]]
    assert len(pairs) == len(set(pairs)) and pairs[0] == ("kubernetes.io/hostname", "ScheduleAnyway")
    server, metrics = spec["containers"]
    env = {e["name"]: e["value"] for e in server["env"]}
    assert env["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST" and env["NCCL_DEBUG"] == "WARN"  # the user's win
    assert metrics["env"] == [{"name": "PORT", "value": "9102"}]  # no GPUs, no NCCL
    assert meta["annotations"]["prometheus.io/scrape"] == "true"
    assert out["metadata"] == sent["metadata"]
    assert spec["tolerations"] == template_of(sent)["spec"]["tolerations"]


def test_a_pod_the_job_controller_makes_from_our_template_is_not_placed_again(index):
    body = load_json("review-controller-pod.json")
    before = dict(index.ledger.holds)
    result = run(body, index)
    assert result.outcome == "ignored" and "patch" not in result.review["response"]
    assert result.name == "train-" and result.namespace == "ml"
    assert index.ledger.holds == before


def test_a_controller_pod_whose_template_was_never_placed_is_placed(index):
    body = load_json("review-controller-pod.json")
    pod = body["request"]["object"]
    for key in (mutation.PLACEMENT, mutation.INJECTED, mutation.RESERVATION, mutation.GPU_IDS):
        pod["metadata"]["annotations"].pop(key, None)
    del pod["spec"]["affinity"]
    pod["metadata"]["annotations"]["topology.scheduler/placement-strategy"] = "consolidated"
    result = run(body, index)
    assert result.outcome == "placed"
    assert f"ml/Pod/train-{body['request']['uid']}" in index.ledger.holds


# -- reservations, dry runs, reinvocation --------------------------------------------------------------

def job(**annotations) -> dict:
    return workload("Job", replicas=2, annotations={"topology.scheduler/placement-strategy": "consolidated",
                                                    **annotations})


def test_a_placed_workload_is_reserved_under_its_key(index):
    result = run(job(), index)
    assert result.outcome == "placed"
    assert set(index.ledger.holds) == {"ml/Job/train"}
    assert index.ledger.holds["ml/Job/train"].nodes == result.decision.nodes


def test_dry_run_reserves_nothing_but_answers_the_same(index):
    dry = run(job(), index, dry_run=True)
    assert index.ledger.holds == {}
    wet = run(job(), index)
    assert dry.outcome == wet.outcome == "placed"
    assert patched(job(), dry) == patched(job(), wet)


def test_reinvocation_on_our_output_changes_nothing_and_books_once(index):
    first = run(job(), index)
    out = patched(job(), first)
    second = run(out, index, uid="another-call")
    assert "patch" not in second.review["response"]
    assert list(index.ledger.holds) == ["ml/Job/train"]


def test_a_generate_name_object_keeps_its_key_across_calls(index):
    pod = workload("Pod", name=None, annotations={"topology.scheduler/gpu-count": "8"})
    pod["metadata"]["generateName"] = "trainer-"
    first = run(pod, index, uid="call-1")
    second = run(patched(pod, first), index, uid="call-2")
    assert "patch" not in second.review["response"]
    assert list(index.ledger.holds) == ["ml/Pod/trainer-call-1"]


def test_a_cronjob_is_placed_without_reserving_and_its_job_is_placed_afresh(index):
    cron = workload("CronJob", name="nightly", annotations={"topology.scheduler/placement-strategy": "consolidated"})
    result = run(cron, index)
    assert result.outcome == "placed" and index.ledger.holds == {}
    made = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
        "name": "nightly-29000000", "namespace": "ml", "annotations": {},
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly", "uid": "c",
                             "controller": True}]}, "spec": deep(patched(cron, result)["spec"]["jobTemplate"]["spec"])}
    job_result = run(made, index)
    assert job_result.outcome == "placed" and "ml/Job/nightly-29000000" in index.ledger.holds
    valid(patched(made, job_result))




def test_a_delete_review_frees_nothing_and_the_watch_seeing_the_deletion_frees_the_hold(index):
    """A review can come from anyone who reaches the port, and a deletion can still be refused
    after us: only the watch's deletion is believed."""
    stored = patched(job(), run(job(), index))
    for dry_run in (True, False):
        result = run(deletion(stored, dry_run=dry_run), index)
        assert result.outcome == "ignored" and result.review["response"]["allowed"] is True
        assert "patch" not in result.review["response"] and list(index.ledger.holds) == ["ml/Job/train"]
    feed.delete(index, stored, "Job")
    assert index.ledger.holds == {} and index.stats().gpus_reserved == 0


def test_deleting_a_replicaset_keeps_its_deployments_reservation(index):
    deployment = workload("Deployment", name="serve", replicas=2,
                          annotations={"topology.scheduler/placement-strategy": "consolidated"})
    stored = patched(deployment, run(deployment, index))
    # its ReplicaSet carries the Deployment's annotations, as the Deployment controller copies them
    replica_set = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
                   "metadata": {"name": "serve-5d8f", "namespace": "ml",
                                "annotations": dict(stored["metadata"].get("annotations") or {},
                                                    **{"topology.scheduler/reservation": "ml/Deployment/serve"})},
                   "spec": deep(stored["spec"])}
    result = run(deletion(replica_set), index)
    assert result.outcome == "ignored" and list(index.ledger.holds) == ["ml/Deployment/serve"]
    feed.delete(index, replica_set, "ReplicaSet")
    assert list(index.ledger.holds) == ["ml/Deployment/serve"]


# -- denials ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("annotations, fragments", [
    pytest.param({"topology.scheduler/gpu-count": "abc"}, ["topology.scheduler/gpu-count", '"abc"', "allowed:"],
                 id="gpu-count not a number"),
    pytest.param({"topology.scheduler/placement-strategy": "packed"},
                 ["topology.scheduler/placement-strategy", '"packed"', "allowed: consolidated"], id="unknown strategy"),
    pytest.param({"topology.scheduler/preferred-domain": "leaf-99"},
                 ["topology.scheduler/preferred-domain", "'leaf-99'", "allowed:"], id="preferred domain not found"),
    pytest.param({"topology.scheduler/network-bandwidth": "200GB"},  # bytes: 1600 Gb/s, never what was meant
                 ["topology.scheduler/network-bandwidth", '"200GB"', "bytes per second", "allowed:", "Gb or Tb"],
                 id="bandwidth in bytes"),
])
def test_denials_name_the_object_the_annotation_the_value_and_what_is_allowed(annotations, fragments, index):
    result = run(workload("Job", annotations=annotations), index)
    assert result.outcome == "denied" and result.review["response"]["allowed"] is False
    message = result.review["response"]["status"]["message"]
    assert message.startswith("Job ml/train")
    for fragment in fragments:
        assert fragment in message
    assert index.ledger.holds == {}


def test_more_than_the_cluster_waits_for_nodes_and_refuse_unplaceable_denies_it(index):
    obj = workload("Job", annotations={"topology.scheduler/gpu-count": "4096"})
    result = run(obj, index)
    assert result.outcome == "waiting-for-nodes" and result.review["response"]["allowed"] is True
    assert any("it waits for nodes to be added" in w for w in result.review["response"]["warnings"])
    assert result.review["response"]["auditAnnotations"]["reason"] == "ExceedsNodes"
    assert index.ledger.holds == {}
    refusing = Config(refuse_unplaceable=True)
    result = run(obj, index_of(refusing, *demo_cluster()), refusing)
    assert result.outcome == "denied" and result.review["response"]["allowed"] is False
    message = result.review["response"]["status"]["message"]
    for fragment in ("Job ml/train", "topology.scheduler/gpu-count", '"4096"', "even with every GPU free"):
        assert fragment in message


def test_no_node_matching_the_selector_waits_for_one(index):
    obj = workload("Job", annotations={"topology.scheduler/gpu-count": "8"}, spec={"nodeSelector": {"pool": "none"}})
    result = run(obj, index)
    assert result.outcome == "waiting-for-nodes" and result.decision.code == "NoMatchingNodes"
    assert "nodeSelector" not in str(result.decision.requirements)
    refusing = Config(refuse_unplaceable=True)
    assert run(obj, index_of(refusing, *demo_cluster()), refusing).outcome == "denied"


# -- waiting ------------------------------------------------------------------------------------------

def full_index(config: Config = CONFIG) -> ClusterIndex:
    """One leaf of 4 nodes x 8 GPUs and 4 more nodes elsewhere, every node half used."""
    nodes = leaf_spine_nodes(spines=1, leaves=2, nodes=4)
    pods = [make_pod(f"busy-{n['metadata']['name']}", n["metadata"]["name"], 4) for n in nodes]
    return index_of(config, nodes, pods)


PINNED = Config(gate_waits=False)


@pytest.mark.parametrize("strategy, config, held, fragment", [
    pytest.param("consolidated", Config(), "gated", "held by scheduling gate", id="consolidated waits behind its gate"),
    pytest.param("consolidated", PINNED, "pinned", "pinned to", id="consolidated waits for locality, pinned"),
    pytest.param("consolidated", Config(pin_when_waiting=False), "preferred", "may start scattered",
                 id="configured to scatter"),
    pytest.param("balanced", PINNED, "pinned", "pinned to", id="balanced waits where waiting pays"),
    pytest.param("balanced", Config(pin_only_where_locality_pays=False), "preferred", "may start scattered",
                 id="balanced only prefers when waits are not weighed"),
])
def test_no_room_now(strategy, config, held, fragment):
    obj = workload("Job", replicas=4, annotations={"topology.scheduler/placement-strategy": strategy})
    result = run(obj, full_index(config), config)  # as `serve` does: the index and the admission read one config
    assert result.outcome == "waiting"
    assert any(fragment in w for w in result.warnings)
    spec = template_of(valid(patched(obj, result)))["spec"]
    affinity = spec.get("affinity", {}).get("nodeAffinity", {})
    assert ("requiredDuringSchedulingIgnoredDuringExecution" in affinity) is (held == "pinned")
    assert ("preferredDuringSchedulingIgnoredDuringExecution" in affinity) is (held == "preferred")
    assert ("schedulingGates" in spec) is (held == "gated")


def test_several_pods_on_one_node_get_a_warning(index):
    obj = workload("Job", replicas=4, gpus=2, annotations={"topology.scheduler/placement-strategy": "consolidated"})
    result = run(obj, index)
    assert result.outcome == "placed" and len(result.decision.nodes) == 1
    assert any("pods share node" in w for w in result.warnings)


# -- not ready, nothing to place, failing open ---------------------------------------------------------

def test_not_ready_admits_ours_unmodified_with_the_reason(index):
    result = admission.review(admission.make_review(job()), index, CONFIG, readiness=(False, "cluster view stale"))
    assert result.outcome == "not-ready" and result.review["response"]["allowed"] is True
    assert "patch" not in result.review["response"]
    assert "cluster view stale" in result.warnings[0]
    other = admission.review(admission.make_review(workload("Job")), index, CONFIG, readiness=(False, "x"))
    assert other.outcome == "ignored" and other.warnings == ()


def test_ours_by_scheduler_name_without_gpus_only_resets_the_scheduler(index):
    obj = workload("Deployment", containers=[container(gpus=0)], spec={"schedulerName": "topology-aware-scheduler"})
    result = run(obj, index)
    assert result.outcome == "ignored" and "requests no nvidia.com/gpu" in result.warnings[0]
    out = valid(patched(obj, result))
    expected = deep(obj)
    template_of(expected)["spec"]["schedulerName"] = "default-scheduler"
    assert out == expected


def test_an_exception_inside_fails_open(index, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise KeyError("boom")
    monkeypatch.setattr(admission.admit, "place_shared", broken)
    with caplog.at_level(logging.ERROR, logger="webhook.admission"):
        result = run(job(), index)
    assert result.outcome == "failed-open" and result.review["response"]["allowed"] is True
    assert "patch" not in result.review["response"]
    assert result.error == "KeyError: 'boom'" and "KeyError" in result.warnings[0]
    assert caplog.records and "failed open" in caplog.records[0].getMessage()


def test_a_pod_bound_to_a_node_is_left_alone(index):
    pod = workload("Pod", annotations={"topology.scheduler/gpu-count": "8"}, spec={"nodeName": "gpu-s1-l1-n3"})
    result = run(pod, index)
    assert result.outcome == "ignored" and "patch" not in result.review["response"] and index.ledger.holds == {}


def test_warnings_are_one_line_and_at_most_256_characters(index):
    obj = workload("Job", name="x" * 240, replicas=2, annotations={"topology.scheduler/gpu-count": "12"})
    result = run(obj, index)
    assert result.warnings and all(len(w) <= 256 for w in result.warnings)


def test_audit_annotations_summarise_the_decision(index):
    result = run(job(), index)
    audit = result.review["response"]["auditAnnotations"]
    assert audit["outcome"] == "placed" and audit["strategy"] == "consolidated" and audit["gpus"] == "16"
    assert audit["domain"] == str(result.decision.scope)


def test_offline_review_of_an_object_without_namespace_or_uid(index):
    obj = workload("Job", namespace=None, annotations={"topology.scheduler/gpu-count": "8"})
    body = admission.make_review(obj, dry_run=True)
    assert admission.make_review(obj, dry_run=True) == body  # same manifest, same review
    result = run(body, index)
    assert result.outcome == "placed" and result.namespace == "default" and index.ledger.holds == {}
    valid(patched(obj, result))


# -- updates ------------------------------------------------------------------------------------------

def deployment(**annotations) -> dict:
    return workload("Deployment", name="serve", replicas=2, gpus=4,
                    annotations={"topology.scheduler/placement-strategy": "consolidated", **annotations})


def update(new: dict, old: dict) -> dict:
    body = admission.make_review(new, operation="UPDATE")
    body["request"]["oldObject"] = old
    return body


def test_an_update_that_drops_our_fields_gets_the_placement_back(index):
    created = run(deployment(), index)
    stored = patched(deployment(), created)
    applied = deployment()  # the user's manifest again, new image: our fields are gone
    template_of(applied)["spec"]["containers"][0]["image"] = "nvcr.io/nvidia/pytorch:25.01-py3"
    reservations = dict(index.ledger.holds)
    result = run(update(applied, stored), index)
    assert result.outcome == "ignored" and result.warnings == ()
    out = valid(patched(applied, result))
    expected = deep(stored)
    template_of(expected)["spec"]["containers"][0]["image"] = "nvcr.io/nvidia/pytorch:25.01-py3"
    assert out == expected
    assert index.ledger.holds == reservations


def test_an_update_of_our_own_output_changes_nothing(index):
    stored = patched(deployment(), run(deployment(), index))
    result = run(update(deep(stored), stored), index)
    assert "patch" not in result.review["response"]


def test_an_update_that_changes_the_inputs_keeps_the_placement_and_says_so(index):
    stored = patched(deployment(), run(deployment(), index))
    changed = deep(stored)
    changed["metadata"]["annotations"]["topology.scheduler/placement-strategy"] = "distributed"
    result = run(update(changed, stored), index)
    assert "patch" not in result.review["response"]
    assert "placement inputs changed" in result.warnings[0]


def test_an_update_of_a_workload_never_placed_places_it(index):
    before = workload("Deployment", name="serve", replicas=2, gpus=4)
    result = run(update(deployment(), before), index)
    assert result.outcome == "placed" and "ml/Deployment/serve" in index.ledger.holds
    valid(patched(deployment(), result))


# -- anything at all --------------------------------------------------------------------------------

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                     max_leaves=12)
_requests = st.fixed_dictionaries({"uid": st.just("u"), "operation": st.sampled_from(["CREATE", "UPDATE", "DELETE"]),
                                   "kind": st.sampled_from([{"group": "batch", "version": "v1", "kind": "Job"},
                                                            {"group": "", "version": "v1", "kind": "Pod"}]),
                                   "object": _json | st.fixed_dictionaries({"metadata": _json, "spec": _json})},
                                  optional={"namespace": _json, "oldObject": _json, "dryRun": _json})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(_json, st.fixed_dictionaries({"kind": st.just("AdmissionReview"),
                                               "apiVersion": st.just("admission.k8s.io/v1"), "request": _requests})))
def test_any_body_gets_an_answer_or_a_malformed_review_error(index, body):
    try:
        result = admission.review(body, index, CONFIG)
    except admission.MalformedReview:
        return
    check_envelope(body, result)


def _paths(node, prefix=()):
    yield prefix
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        yield from _paths(child, prefix + (key,))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["review-deployment-existing-settings.json", "review-controller-pod.json",
                        "review-generatename-pod-v1beta1.json"]), st.data(), _json)
def test_a_corrupted_object_of_ours_is_answered_without_failing_open(index, fixture, data, junk):
    body = load_json(fixture)
    obj = body["request"]["object"]
    path = data.draw(st.sampled_from([p for p in _paths(obj) if p]))
    parent = obj
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = junk
    result = admission.review(body, index, CONFIG)
    check_envelope(body, result)
    assert result.outcome != "failed-open", result.error


def test_a_mistyped_annotation_key_warns_with_did_you_mean(index):
    obj = workload("Job", gpus=8, annotations={"topology.scheduler/gpu-cout": "8",
                                               "topology.scheduler/placement-strategy": "consolidated"})
    result = run(obj, index)
    assert result.outcome == "placed"
    assert any("annotation topology.scheduler/gpu-cout is not one of ours and is ignored; "
               "did you mean topology.scheduler/gpu-count?" in w for w in result.warnings)


def test_a_deployment_with_zero_replicas_is_explained_as_running_no_pods(index):
    obj = workload("Deployment", gpus=8, replicas=0, annotations={"topology.scheduler/placement-strategy": "balanced"})
    result = run(obj, index)
    assert result.outcome == "ignored"
    assert result.warnings == ("Deployment ml/train runs no pods now (spec.replicas: 0), so nothing to place until "
                               "it is scaled up",)


def test_a_gpu_count_of_thousands_of_digits_is_denied_clearly(index):
    result = run(workload("Job", annotations={"topology.scheduler/gpu-count": "9" * 5000}), index)
    message = result.review["response"]["status"]["message"]
    assert result.outcome == "denied" and "(5000 digits) is not allowed" in message and len(message) < 300


def test_a_preferred_domain_that_cannot_hold_the_job_is_warned_about(index):
    obj = workload("Job", gpus=8, replicas=4, annotations={"topology.scheduler/preferred-domain": "leaf-1",
                                                           "topology.scheduler/placement-strategy": "consolidated"})
    result = run(obj, index)
    assert result.outcome == "placed" and result.decision.preferred_honoured is False
    assert any(w.startswith("Job ml/train: preferred leaf leaf-1 cannot hold") for w in result.warnings), result.warnings


def test_an_object_nested_500_levels_deep_is_denied_clearly_not_failed_open(index):
    obj = workload("Job", annotations={"topology.scheduler/placement-strategy": "consolidated"})
    node = template_of(obj)["spec"]
    for _ in range(500):
        node["x"] = {}
        node = node["x"]
    result = run(obj, index)
    assert result.outcome == "denied"
    assert result.review["response"]["status"]["message"] == (
        "Job ml/train: the object is nested more than 100 levels deep; allowed: at most 100 levels")


@pytest.mark.parametrize("field", ["kind", "apiVersion"])
def test_a_malformed_review_is_quoted_back_within_bounds(field):
    body = {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", field: "x" * 100_000}
    with pytest.raises(admission.MalformedReview) as caught:
        admission.review(body, None, CONFIG)
    assert len(str(caught.value)) < 200 and "..." in str(caught.value)


@pytest.mark.parametrize("written, owner, kept", [
    ("ml/Pod/trainer-abc", None, True),  # its own key from an earlier call
    ("ml/Job/train", {"kind": "Job", "name": "train", "controller": True}, True),  # its controller's
    ("ml/Job/train", None, False),  # a Job it does not belong to
    ("other/Pod/trainer-abc", None, False),  # another namespace
    ("other/Job/train", {"kind": "Job", "name": "train", "controller": True}, False),
])
def test_a_generate_name_pod_keeps_a_written_reservation_key_only_if_it_is_its_own(index, written, owner, kept):
    pod = make_pod("x", None, 1, namespace="ml", annotations={"topology.scheduler/placement-strategy": "balanced",
                                                              "topology.scheduler/reservation": written})
    del pod["metadata"]["name"], pod["status"], pod["metadata"]["uid"]
    pod["metadata"]["generateName"] = "trainer-"
    if owner:
        pod["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "uid": "u", **owner}]
    result = run(pod, index)
    key = patched(pod, result)["metadata"]["annotations"]["topology.scheduler/reservation"]
    assert (key == written) is kept
    assert key.startswith("ml/")


def test_the_result_carries_the_patch_it_sends_and_the_object_as_admitted(index):
    job = gpu_job("result", 1, 8, placement_strategy="consolidated")
    result = admission.review(admission.make_review(job), index, CONFIG)
    response = result.review["response"]
    assert list(result.patch) == json.loads(base64.b64decode(response["patch"]))
    assert result.admitted == jsonpatch.apply_patch(job, list(result.patch))
    assert "topology.scheduler/placement" in result.admitted["spec"]["template"]["metadata"]["annotations"]
    denied = admission.review(admission.make_review(gpu_job("big", 1, 8, gpu_count="lots")), index, CONFIG)
    assert denied.outcome == "denied" and denied.admitted is None and denied.patch == ()


@pytest.mark.parametrize("nameless", [{"image": "x"}, {"name": None, "image": "x"}], ids=["absent", "null"])
def test_a_container_without_a_name_is_denied_as_malformed_not_failed_open(index, nameless):
    job = workload("Job", containers=[container(), {**nameless, "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                   annotations={"topology.scheduler/placement-strategy": "consolidated"})
    result = run(job, index)
    assert result.outcome == "denied"
    assert "spec.template.spec.containers[1].name is null; expected a non-empty string" in \
        result.review["response"]["status"]["message"]
