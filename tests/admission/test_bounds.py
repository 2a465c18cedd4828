"""What a review takes on (webhook/objects/limits.py): a template of any size is answered within
bounds, refused past them with the count and the bound, and nothing we send back is an object
the apiserver would refuse for the size of its annotations."""
import base64
import json

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures.builders import container, template_of, valid, workload
from webhook import admission
from webhook.core.injection import INJECTED
from webhook.kube.demo import demo_cluster
from webhook.objects.feed import index_of
from webhook.objects.limits import ANNOTATIONS_MAX_BYTES, MAX_CONTAINERS
from webhook.settings.config import Config

CONFIG = Config()
STRATEGY = {"topology.scheduler/placement-strategy": "consolidated"}


@pytest.fixture
def index():
    return index_of(CONFIG, *demo_cluster())


def job_with_init_containers(count: int, gpus: int = 1) -> dict:
    """The tenant's template of the issue: `count` init containers, each asking `gpus` GPUs, before
    one 8-GPU trainer."""
    return workload("Job", annotations=STRATEGY, spec={"initContainers": [
        container(f"step-{i}", gpus=gpus) for i in range(count)]})


def operations(result: admission.AdmissionResult) -> list:
    patch = result.review["response"].get("patch")
    return json.loads(base64.b64decode(patch)) if patch else []


def annotation_bytes(template: dict) -> int:
    return sum(len(k.encode()) + len(v.encode()) for k, v in (template["metadata"].get("annotations") or {}).items())


def test_twenty_thousand_gpu_init_containers_are_refused_at_once_with_the_count_and_the_bound(index):
    before = dict(index.ledger.holds)
    result = admission.review(admission.make_review(job_with_init_containers(20_000)), index, CONFIG)
    assert result.outcome == "denied" and result.patch == ()
    assert result.review["response"]["status"]["message"] == (
        "Job ml/train: has 20001 containers in its pod templates (spec.template.spec.initContainers: 20000, "
        f"spec.template.spec.containers: 1); allowed: at most {MAX_CONTAINERS} in all, init containers included")
    assert index.ledger.holds == before  # refused before anything was placed or held


@pytest.mark.parametrize("kind", ["Pod", "Deployment", "CronJob"])
def test_the_bound_counts_every_container_of_every_kind(index, kind):
    obj = workload(kind, annotations=STRATEGY, containers=[container(f"c{i}", gpus=0) for i in range(MAX_CONTAINERS)],
                   spec={"initContainers": [container("one-more", gpus=1)]})
    result = admission.review(admission.make_review(obj), index, CONFIG)
    assert result.outcome == "denied"
    assert f"has {MAX_CONTAINERS + 1} containers" in result.review["response"]["status"]["message"]


def test_the_bound_is_on_all_the_templates_of_an_object_together(index):
    """A JobSet's replicated Jobs each within the bound, together past it: the message says where."""
    def replicated(name: str, count: int) -> dict:
        return {"name": name, "replicas": 1, "template": {"spec": {"template": {"spec": {
            "restartPolicy": "Never", "containers": [container(f"c{i}", gpus=0) for i in range(count)]}}}}}
    jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
              "metadata": {"name": "sweep", "namespace": "ml", "annotations": STRATEGY},
              "spec": {"replicatedJobs": [replicated("leader", 1), replicated("workers", 200), replicated("eval", 100)]}}
    result = admission.review(admission.make_review(jobset), index, CONFIG)
    assert result.outcome == "denied" and result.review["response"]["status"]["message"] == (
        "JobSet ml/sweep: has 301 containers in its pod templates (spec.replicatedJobs[1].template.spec.template.spec"
        ".containers: 200, spec.replicatedJobs[2].template.spec.template.spec.containers: 100, "
        "spec.replicatedJobs[0].template.spec.template.spec.containers: 1); allowed: at most 256 in all, init "
        "containers included")


def test_at_the_bound_the_patch_touches_only_the_containers_where_ranks_run(index):
    """255 GPU init containers and the trainer: placed, valid, and patched in the trainer alone
    (classic init containers run before the ranks start and take no part in their communicators)."""
    obj = job_with_init_containers(MAX_CONTAINERS - 1)
    result = admission.review(admission.make_review(obj), index, CONFIG)
    assert result.outcome == "placed"
    patch = operations(result)
    assert {op["path"].split("/env")[0] for op in patch if "/env" in op["path"]} == {"/spec/template/spec/containers/0"}
    assert len(patch) <= 12, patch
    admitted = valid(jsonpatch.apply_patch(obj, patch))
    assert admitted["spec"]["template"]["spec"]["initContainers"] == obj["spec"]["template"]["spec"]["initContainers"]


def test_a_gpu_sidecar_gets_the_env_and_a_gpu_init_container_does_not(index):
    obj = workload("Job", annotations=STRATEGY, containers=[container(gpus=4)], spec={"initContainers": [
        container("warm-up", gpus=8), container("sidecar", gpus=1, restartPolicy="Always")]})
    admitted = valid(admission.review(admission.make_review(obj), index, CONFIG).admitted)
    init = {c["name"]: c for c in template_of(admitted)["spec"]["initContainers"]}
    assert "env" not in init["warm-up"]
    assert {e["name"] for e in init["sidecar"]["env"]} >= {"CUDA_DEVICE_ORDER"}


def test_more_node_terms_than_a_gated_wait_could_be_released_with_are_refused(index):
    terms = [{"matchExpressions": [{"key": "example.com/rack", "operator": "In", "values": [f"r{i}"]}]}
             for i in range(65)]
    obj = workload("Job", annotations=STRATEGY, spec={"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}})
    result = admission.review(admission.make_review(obj), index, CONFIG)
    assert result.outcome == "denied" and result.review["response"]["status"]["message"] == (
        "Job ml/train: spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution."
        "nodeSelectorTerms has 65 terms; allowed: at most 64")


def test_a_template_our_annotations_would_push_past_the_apiservers_limit_is_refused_saying_so(index):
    """The user's own annotations leave 300 bytes: our placement, record and reservation take more.
    The apiserver would refuse the object; we say why instead."""
    notes = "example.com/notes"
    obj = workload("Job", annotations=STRATEGY, template_annotations={
        notes: "x" * (ANNOTATIONS_MAX_BYTES - len(notes) - 300)})
    result = admission.review(admission.make_review(obj), index, CONFIG)
    assert result.outcome == "denied" and result.patch == ()
    message = result.review["response"]["status"]["message"]
    assert message.startswith("Job ml/train: spec.template.metadata.annotations would total ")
    assert f"in {INJECTED}); allowed: at most {ANNOTATIONS_MAX_BYTES} bytes" in message


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.integers(0, 3_000), st.sampled_from(["Pod", "Job"]), st.integers(1, 8))
def test_no_object_we_send_back_carries_more_annotations_than_the_apiserver_takes(index, room, kind, sidecars):
    """Whatever room the user's own annotations leave, the answer is a denial or an object whose
    every annotation map is within the apiserver's limit."""
    obj = workload(kind, annotations=STRATEGY, template_annotations={"example.com/notes": "x" * (
        ANNOTATIONS_MAX_BYTES - room - len("example.com/notes"))}, spec={"initContainers": [
            container(f"rank-{i}", gpus=1, restartPolicy="Always") for i in range(sidecars)]},
        containers=[container("trainer", gpus=0)])
    result = admission.review(admission.make_review(obj), index, CONFIG)
    if result.outcome == "denied":
        assert "allowed: at most 262144 bytes" in result.review["response"]["status"]["message"]
        return
    admitted = result.admitted
    assert annotation_bytes(template_of(admitted)) <= ANNOTATIONS_MAX_BYTES
    assert annotation_bytes(admitted) <= ANNOTATIONS_MAX_BYTES
