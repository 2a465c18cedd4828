"""The object under admission read once (webhook/objects/subject.py): each kind's pod templates
found where its table says, the questions admission asks answered from them, a malformed object
refused with the field named, and the templates walked and the shape checked once per admission."""
import datetime
import sys

import pytest

from tests.fixtures.builders import API_VERSIONS, container, subject_of, template_of, workload
from webhook import admission
from webhook.kube.demo import demo_cluster
from webhook.cli import file_index
from webhook.objects import mutation, templates
from webhook.objects.kinds import BY_KEY, REGISTRY
from webhook.objects import workload as wl
from webhook.objects.subject import Subject
from webhook.objects.user_annotations import InvalidWorkload
from webhook.settings.config import Config

GPU_COUNT = "topology.scheduler/gpu-count"
CONFIG = Config()


def operator_template(gpus: int) -> dict:
    return {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [container(gpus=gpus)]}}


@pytest.mark.parametrize("kind", list(API_VERSIONS))
def test_a_subject_of_each_kind_finds_the_one_template_inside_it(kind):
    obj = workload(kind)
    subject = subject_of(obj)
    assert [found.template for found in subject.templates] == [template_of(obj)]
    assert subject.template is template_of(obj) is templates.pod_template(BY_KEY[kind], obj)


@pytest.mark.parametrize("obj, where", [
    pytest.param({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "j"}, "spec": {
        "replicatedJobs": [{"name": "a", "template": {"spec": {"template": operator_template(0)}}},
                           {"name": "b", "template": {"spec": {"template": operator_template(8)}}}]}},
        ["spec.replicatedJobs[0].template.spec.template", "spec.replicatedJobs[1].template.spec.template"],
        id="JobSet: each replicated Job's"),
    pytest.param({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "p"}, "spec": {
        "pytorchReplicaSpecs": {"Master": {"template": operator_template(8)},
                                "Worker": {"replicas": 3, "template": operator_template(8)}}}},
        ["spec.pytorchReplicaSpecs.Master.template", "spec.pytorchReplicaSpecs.Worker.template"],
        id="PyTorchJob: each replica spec's"),
    pytest.param({"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "r"}, "spec": {"rayClusterSpec": {
        "headGroupSpec": {"template": operator_template(0)},
        "workerGroupSpecs": [{"replicas": 2, "template": operator_template(8)}]}}},
        ["spec.rayClusterSpec.headGroupSpec.template", "spec.rayClusterSpec.workerGroupSpecs[0].template"],
        id="RayJob: the head's, then each worker group's"),
])
def test_the_operators_kinds_have_every_template_found_in_their_order(obj, where):
    subject = subject_of(obj)
    assert [found.where for found in subject.templates] == where
    assert all(found.template is not None for found in subject.templates)
    for found in subject.templates:  # its steps lead there: the mutation copies the way down by them
        node = obj
        for step in found.steps:
            node = node[step]
        assert node is found.template
    assert subject.template is subject.templates[0].template
    assert subject.ours(Config()) is False  # nothing of ours on it: found, and still not ours


def test_annotations_merge_the_templates_and_the_object_wins():
    obj = workload("Job", annotations={GPU_COUNT: "16"}, template_annotations={GPU_COUNT: "8", "a": "b"})
    assert subject_of(obj).annotations == {GPU_COUNT: "16", "a": "b"}


@pytest.mark.parametrize("obj, ours", [
    pytest.param(workload("Job", annotations={GPU_COUNT: "8"}), True, id="annotation on the object"),
    pytest.param(workload("Job", template_annotations={"topology.scheduler/latency-sensitive": "true"}), True,
                 id="annotation on the template"),
    pytest.param(workload("Deployment", spec={"schedulerName": "topology-aware-scheduler"}), True,
                 id="our scheduler name"),
    pytest.param(workload("Job", spec={"schedulerName": "kai-scheduler"}), False, id="another scheduler"),
    pytest.param(workload("Job", annotations={"scheduling.run.ai/topology-policy": "x"}), False,
                 id="someone else's annotations"),
    pytest.param({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "annotations": {GPU_COUNT: "8"}}}, False, id="a kind we do not place"),
    pytest.param({**workload("Job", annotations={GPU_COUNT: "8"}), "apiVersion": "example.com/v1"}, False,
                 id="a kind of that name in another API group"),
])
def test_is_ours(obj, ours):
    assert subject_of(obj).ours(Config()) is ours


def test_scheduler_names_are_configurable():
    subject = subject_of(workload("Job", spec={"schedulerName": "gpu-sched"}))
    assert subject.ours(Config(scheduler_names=("gpu-sched",)))
    assert not subject.ours(Config())


def test_a_malformed_object_of_another_kind_is_asked_whether_it_is_ours_without_raising():
    job = workload("Job", annotations={GPU_COUNT: "8"})
    job["spec"]["template"] = ["not", "a", "template"]
    job["metadata"]["annotations"] = ["not", "a", "map"]
    subject = subject_of(job)
    assert [found.template for found in subject.templates] == [None]
    assert not subject.ours(Config()) and not subject.bound and not subject.placed


def test_controller_owned_needs_a_controller_reference():
    pod = workload("Pod", name=None)
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u",
                                           "controller": True}]
    assert subject_of(pod).controller_owned
    pod["metadata"]["ownerReferences"][0]["controller"] = False
    assert not subject_of(pod).controller_owned


def test_display_name_uses_generate_name():
    pod = workload("Pod", name=None)
    pod["metadata"]["generateName"] = "train-"
    assert subject_of(pod).who == "Pod ml/train-"


def test_suspended_reads_its_kinds_field_and_the_old_object_is_a_subject_of_its_own():
    old = workload("Job", annotations={GPU_COUNT: "8"})
    old["spec"]["suspend"] = True
    subject = subject_of(workload("Job", annotations={GPU_COUNT: "8"}), old=old)
    assert not subject.suspended and subject.old is not None and subject.old.suspended
    assert subject.old.obj is old and subject.old.old is None


@pytest.mark.parametrize("group, kind, supported", [
    ("", "Pod", True), ("batch", "Job", True), ("batch", "CronJob", True), ("apps", "Deployment", True),
    ("apps", "StatefulSet", True), ("apps", "ReplicaSet", True), ("example.com", "Job", False), ("", "Node", False),
])
def test_supports_kind_by_group(group, kind, supported):
    assert Subject(kind, group, {}, "ml").supported is supported


@pytest.mark.parametrize("kind, path, value, message", [
    pytest.param("Job", ("spec", "template", "spec", "containers"), "trainer",
                 'spec.template.spec.containers is "trainer"; expected a list', id="containers not a list"),
    pytest.param("Job", ("spec", "template", "spec", "containers", 0, "env"), {"A": "b"},
                 "spec.template.spec.containers[0].env is a dict; expected a list", id="env as a mapping"),
    pytest.param("Pod", ("spec", "containers", 0, "name"), False,
                 "spec.containers[0].name is false; expected a non-empty string", id="container name not a string"),
    pytest.param("Pod", ("spec", "containers", 0, "name"), None,
                 "spec.containers[0].name is null; expected a non-empty string", id="container name null"),
    pytest.param("Job", ("spec", "template", "spec", "initContainers"), [{"image": "x"}],
                 "spec.template.spec.initContainers[0].name is null; expected a non-empty string",
                 id="container without a name"),
    pytest.param("Pod", ("metadata", "annotations", GPU_COUNT), 8,
                 f"metadata.annotations.{GPU_COUNT} is 8; expected a string", id="unquoted annotation value"),
    pytest.param("CronJob", ("spec", "jobTemplate"), [],
                 "spec.jobTemplate is a list; expected a mapping", id="job template not a mapping"),
    pytest.param("Deployment", ("spec", "template", "spec", "affinity", "nodeAffinity",
                                "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms"), [None],
                 "nodeSelectorTerms[0] is null; expected a mapping", id="null list item"),
])
def test_fields_we_use_must_have_their_api_type(kind, path, value, message):
    obj = workload(kind, containers=[container(env=[])], annotations={GPU_COUNT: "8"})
    node = obj
    for key in path[:-1]:
        node = node.setdefault(key, {}) if isinstance(node, dict) else node[key]
    node[path[-1]] = value
    with pytest.raises(InvalidWorkload) as err:
        subject_of(obj).check()
    assert str(err.value).startswith(f"{kind} ml/train: ") and str(err.value).endswith(message)
    with pytest.raises(InvalidWorkload) as read_err:  # reading the request refuses it the same way
        wl.read(subject_of(obj))
    assert str(read_err.value) == str(err.value)
    result = admission.review(admission.make_review(obj), None, CONFIG)
    assert result.outcome == "denied" and result.review["response"]["status"]["message"] == str(err.value)


def test_nesting_is_refused_before_the_fields_are_checked():
    obj = workload("Job", annotations={GPU_COUNT: "8"})
    obj["spec"]["template"]["spec"]["containers"] = "trainer"
    node = obj["metadata"]
    for _ in range(120):
        node["x"] = {}
        node = node["x"]
    with pytest.raises(InvalidWorkload, match="^Job ml/train: the object is nested more than 100 levels deep"):
        subject_of(obj).check()


def test_a_spec_that_passed_once_is_not_walked_again_and_what_is_outside_it_still_is(monkeypatch):
    """Pods made from one template differ outside their spec: the spec's checks are remembered,
    by kind and text; the rest (names, annotations, how deep it nests) is checked every time."""
    first, second = (workload("Pod", name=name, annotations={GPU_COUNT: "8"}) for name in ("a-1", "a-2"))
    subject_of(first).check()
    checks = spy(monkeypatch, templates.check_fields)
    subject_of(second).check()
    assert [call[1].get("spec") for call in checks] == [None]  # only what is outside the spec
    bad = workload("Pod", name="a-3", annotations={GPU_COUNT: "8"})
    bad["metadata"]["annotations"]["team"] = 7
    with pytest.raises(InvalidWorkload, match="metadata.annotations.team is 7; expected a string"):
        subject_of(bad).check()
    deep = workload("Pod", name="a-4", annotations={GPU_COUNT: "8"})
    node = deep["metadata"]
    for _ in range(120):
        node["x"] = {}
        node = node["x"]
    with pytest.raises(InvalidWorkload, match="nested more than 100 levels deep"):
        subject_of(deep).check()


def test_a_spec_remembered_as_passing_does_not_pass_one_whose_text_is_alike_but_not_its_types():
    """A date YAML loaded where a string must be writes the same text as the string: such a spec
    is never looked up, and checked whole."""
    as_text = workload("Job", annotations={GPU_COUNT: "8"}, template_annotations={"built": "2026-01-02"})
    subject_of(as_text).check()
    as_date = workload("Job", annotations={GPU_COUNT: "8"},
                       template_annotations={"built": datetime.date(2026, 1, 2)})
    with pytest.raises(InvalidWorkload, match="annotations.built is a date; expected a string"):
        subject_of(as_date).check()


def test_every_pod_template_but_a_pods_own_is_under_the_spec():
    """What lets a remembered spec stand for every template's check (Subject.check)."""
    for kind in REGISTRY:
        for spec_of in kind.templates:
            path = spec_of.replica_spec + spec_of.template
            assert (kind.key == "Pod" and path == ()) or path[:1] == ("spec",), kind.key


def spy(monkeypatch, function) -> list[tuple]:
    """Every call of `function` from any webhook module that imported it (its own included)."""
    calls: list[tuple] = []

    def spying(*args):
        calls.append(args)
        return function(*args)

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("webhook.") and getattr(module, function.__name__, None) is function:
            monkeypatch.setattr(module, function.__name__, spying)
    return calls


def test_the_request_is_read_without_checking_a_checked_shape_again(monkeypatch):
    written_by_user = workload("Job", annotations={GPU_COUNT: "16"}, replicas=2)
    index, _ = file_index(CONFIG, demo_cluster())
    placed = admission.review(admission.make_review(written_by_user), index, CONFIG).admitted
    checks = spy(monkeypatch, templates.check_fields)
    subject = subject_of(placed)
    subject.check()
    written = mutation.without_injection(subject)
    assert written is not subject and written.obj == written_by_user
    assert wl.read(written).request.pods == 2
    assert len(checks) == 1 and checks[0][1] is placed  # the copy as the user wrote it is not checked again
    wl.read(subject_of(placed))
    assert len(checks) == 2  # a subject nobody checked is checked by reading it


@pytest.mark.parametrize("case", ["a new Job", "a copy of another Job's output", "an UPDATE of a placed Deployment"])
def test_one_admission_finds_the_templates_once_and_checks_the_shape_once(monkeypatch, case):
    index, _ = file_index(CONFIG, demo_cluster())
    job = workload("Job", replicas=2, annotations={GPU_COUNT: "16"})
    if case == "a new Job":
        review, shapes = admission.make_review(job), 1
    elif case == "a copy of another Job's output":
        copied = admission.review(admission.make_review(workload("Job", name="other", replicas=2,
                                                                 annotations={GPU_COUNT: "16"})), index, CONFIG).admitted
        copied["metadata"]["name"] = "train"
        review, shapes = admission.make_review(copied), 1
    else:
        old = admission.review(admission.make_review(workload("Deployment", replicas=2, annotations={GPU_COUNT: "16"})),
                               index, CONFIG).admitted
        new = {**old, "spec": {**old["spec"], "revisionHistoryLimit": 3}}
        review = admission.make_review(new, operation="UPDATE")
        review["request"]["oldObject"] = old
        shapes = 2  # the new object's, and the old one's as it was written (its request is compared)
    walks, checks = spy(monkeypatch, templates.pod_templates), spy(monkeypatch, templates.check_fields)
    obj = review["request"]["object"]
    result = admission.review(review, index, CONFIG)
    assert result.outcome in ("placed", "ignored") and result.error is None
    if case == "an UPDATE of a placed Deployment":
        assert result.warnings == () and result.admitted["spec"]["template"] == old["spec"]["template"]
    else:
        assert result.outcome == "placed"
    assert sum(1 for call in walks if call[1] is obj) == 1
    assert len(checks) == shapes and sum(1 for call in checks if call[1] is obj) == 1
