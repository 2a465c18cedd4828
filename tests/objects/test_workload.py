import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixtures.builders import container, subject_of, workload
from webhook.core.model import Strategy
from webhook.objects import workload as wl
from webhook.objects.user_annotations import InvalidAnnotation, InvalidWorkload

GPU_COUNT = "topology.scheduler/gpu-count"
GROUP_SIZE = "topology.scheduler/group-size"


@pytest.mark.parametrize("kind, replicas, per_pod, gpu_count, pods, gpus, warning", [
    pytest.param("Job", 2, 8, None, 2, 8, None, id="limits x parallelism when gpu-count is absent"),
    pytest.param("Job", 2, 8, "16", 2, 8, None, id="gpu-count agreeing with limits x parallelism"),
    pytest.param("Job", 2, 8, "32", 4, 8, "gpu-count wins", id="gpu-count dividing by per-pod sets the pods"),
    pytest.param("Job", 2, 8, "12", 2, 8, "containers win", id="gpu-count not dividing by per-pod: limits win"),
    pytest.param("Pod", None, 8, "16", 1, 8, "a Pod holds", id="a Pod holds what its containers request"),
    pytest.param("Deployment", 2, 0, "8", 2, 4, "request no nvidia.com/gpu", id="no limits: gpu-count over replicas"),
    pytest.param("Deployment", None, 4, None, 1, 4, None, id="replicas default to 1"),
    pytest.param("StatefulSet", 3, 2, None, 3, 2, None, id="statefulset replicas"),
    pytest.param("ReplicaSet", 2, 1, None, 2, 1, None, id="replicaset replicas"),
    pytest.param("CronJob", 4, 2, None, 4, 2, None, id="cronjob uses its job template's parallelism"),
    pytest.param("Job", None, 8, "8", 1, 8, None, id="job parallelism defaults to 1"),
])
def test_size_rule(kind, replicas, per_pod, gpu_count, pods, gpus, warning):
    obj = workload(kind, gpus=per_pod, replicas=replicas,
                   annotations={GPU_COUNT: gpu_count} if gpu_count else {"topology.scheduler/placement-strategy": "balanced"})
    read = wl.read(subject_of(obj))
    assert (read.request.pods, read.request.gpus_per_pod) == (pods, gpus)
    if warning is None:
        assert read.warnings == ()
    else:
        assert len(read.warnings) == 1 and warning in read.warnings[0] and "train" in read.warnings[0]


def test_job_completions_cap_the_pods_running_at_once():
    obj = workload("Job", replicas=4, gpus=2)
    obj["spec"]["completions"] = 1
    assert wl.read(subject_of(obj)).request.pods == 1


def test_a_null_count_takes_the_default():
    obj = workload("Deployment", gpus=2)
    obj["spec"]["replicas"] = None
    assert wl.read(subject_of(obj)).request.pods == 1


@pytest.mark.parametrize("kind, replicas", [("Deployment", 0), ("Job", 0)], ids=["deployment scaled to 0", "job 0"])
def test_nothing_runs_nothing_to_place(kind, replicas):
    assert wl.read(subject_of(workload(kind, replicas=replicas))).request is None


def test_no_gpus_anywhere_means_nothing_to_place():
    obj = workload("Job", gpus=0, spec={"schedulerName": "topology-aware-scheduler"})
    assert wl.read(subject_of(obj)).request is None


@pytest.mark.parametrize("key, value, allowed", [
    pytest.param(GPU_COUNT, "abc", "whole number of GPUs greater than 0", id="gpu-count not a number"),
    pytest.param(GPU_COUNT, "0", "whole number of GPUs greater than 0", id="gpu-count zero"),
    pytest.param(GPU_COUNT, "-4", "whole number of GPUs greater than 0", id="gpu-count negative"),
    pytest.param(GPU_COUNT, "1.5", "whole number of GPUs greater than 0", id="gpu-count fractional"),
    pytest.param(GPU_COUNT, "\u0668", "in the digits 0-9", id="gpu-count Arabic-Indic 8"),
    pytest.param(GPU_COUNT, "\uff18", "in the digits 0-9", id="gpu-count fullwidth 8"),
    pytest.param(GPU_COUNT, "1\u0666", "in the digits 0-9", id="gpu-count ASCII and Arabic-Indic"),
    pytest.param("topology.scheduler/network-bandwidth", "\u0664\u0660\u0660Gb", "200Gb",
                 id="bandwidth in Arabic-Indic digits"),
    pytest.param("topology.scheduler/network-bandwidth", "\uff14\uff10\uff10Gb", "200Gb",
                 id="bandwidth in fullwidth digits"),
    pytest.param("topology.scheduler/placement-strategy", "tight", "consolidated, distributed, balanced",
                 id="unknown strategy"),
    pytest.param("topology.scheduler/latency-sensitive", "yes", "true, false", id="latency-sensitive not boolean"),
    pytest.param("topology.scheduler/network-bandwidth", "fast", "200Gb", id="bandwidth not a quantity"),
    pytest.param("topology.scheduler/network-bandwidth", "0Gb", "200Gb", id="bandwidth zero"),
    pytest.param("topology.scheduler/network-bandwidth", "200GB", "bits per second", id="bandwidth in bytes"),
    pytest.param("topology.scheduler/network-bandwidth", "25GBps", "Gb, not GB", id="bandwidth in bytes per second"),
    pytest.param("topology.scheduler/preferred-domain", "", "LEVEL=VALUE", id="preferred domain empty"),
    pytest.param("topology.scheduler/preferred-domain", "leaf 1", "LEVEL=VALUE", id="preferred domain with a space"),
])
def test_invalid_annotation_names_object_annotation_value_and_allowed(key, value, allowed):
    with pytest.raises(InvalidAnnotation) as err:
        wl.read(subject_of(workload("Job", annotations={key: value})))
    message = str(err.value)
    assert message.startswith("Job ml/train: ") and key in message and f'"{value}"' in message
    assert "allowed: " in message and allowed in message and "\n" not in message


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(categories=["Nd"]), min_size=1, max_size=3), st.sampled_from([GPU_COUNT, GROUP_SIZE]))
def test_an_integer_annotation_takes_the_digits_0_to_9_and_no_other_script(digits, key):
    """Python's int() reads every script's digits (`\u0668` and `\uff18` are 8); Kubernetes reads
    only 0-9. What int() would take in other digits is refused with the annotation's message."""
    obj = workload("Pod", gpus=1, annotations={key: digits, "topology.scheduler/group": "sweep"})
    if digits.isascii() and int(digits) > 0:
        wl.read(subject_of(obj))
        return
    with pytest.raises(InvalidAnnotation) as err:
        wl.read(subject_of(obj))
    assert f'{key}="{digits}"' in str(err.value) and "allowed: " in str(err.value)


def test_gpu_count_that_does_not_divide_over_replicas_without_limits_is_denied():
    with pytest.raises(InvalidAnnotation, match="does not divide over 4 pods; allowed: a multiple of 4"):
        wl.read(subject_of(workload("Deployment", gpus=0, replicas=4, annotations={GPU_COUNT: "10"})))


@pytest.mark.parametrize("obj, fragment", [
    pytest.param({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
                  "spec": {"parallelism": 4}}, "spec.template.spec is missing", id="job without template"),
    pytest.param(workload("Job", replicas="4"), 'spec.parallelism="4" is not allowed', id="parallelism as a string"),
    pytest.param(workload("Job", containers=[{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1.5"}}}]),
                 "nvidia.com/gpu request", id="fractional GPU limit"),
])
def test_invalid_workload_is_a_clear_error(obj, fragment):
    with pytest.raises(InvalidWorkload, match=fragment):
        wl.read(subject_of(obj))


def test_annotations_come_from_object_and_template_and_the_object_wins():
    obj = workload("Job", replicas=2, gpus=4,
                   annotations={"topology.scheduler/placement-strategy": "distributed"},
                   template_annotations={"topology.scheduler/placement-strategy": "consolidated",
                                         "topology.scheduler/latency-sensitive": "TRUE",
                                         "topology.scheduler/network-bandwidth": "200Gb",
                                         "topology.scheduler/preferred-domain": "spine=spine-1"})
    request = wl.read(subject_of(obj)).request
    assert request.strategy is Strategy.DISTRIBUTED
    assert request.latency_sensitive is True
    assert request.min_bandwidth_gbps == 200.0
    assert request.preferred_domain == "spine=spine-1"
    assert request.workload == "Job ml/train"


def test_defaults_are_balanced_and_not_latency_sensitive():
    request = wl.read(subject_of(workload("Pod", annotations={GPU_COUNT: "8"}))).request
    assert (request.strategy, request.latency_sensitive, request.preferred_domain, request.min_bandwidth_gbps) == (
        Strategy.BALANCED, False, None, None)


def test_node_constraints_of_the_template_are_copied():
    terms = [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H100"]}]}]
    tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    obj = workload("Deployment", annotations={GPU_COUNT: "8"}, spec={
        "nodeSelector": {"pool": "train"}, "tolerations": tolerations,
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}})
    request = wl.read(subject_of(obj)).request
    assert request.node_selector == {"pool": "train"}
    assert list(request.required_node_terms) == terms
    assert list(request.tolerations) == tolerations


def test_sidecar_and_init_gpus_count_as_the_scheduler_counts_them():
    obj = workload("Pod", annotations={"topology.scheduler/placement-strategy": "balanced"}, spec={
        "initContainers": [container("setup", gpus=8), container("sidecar", gpus=1, restartPolicy="Always")]},
        containers=[container("main", gpus=2)])
    assert wl.read(subject_of(obj)).request.gpus_per_pod == 8  # max(2 + 1 sidecar, 8 init)


def test_only_empty_required_terms_match_no_node_and_are_denied():
    obj = workload("Job", spec={"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{}, {}]}}}})
    with pytest.raises(InvalidWorkload, match="an empty term matches no node"):
        wl.read(subject_of(obj))


def test_an_empty_term_beside_others_adds_nothing_to_the_request():
    term = {"matchExpressions": [{"key": "a", "operator": "Exists"}]}
    obj = workload("Job", spec={"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{}, term]}}}})
    assert wl.read(subject_of(obj)).request.required_node_terms == (term,)
