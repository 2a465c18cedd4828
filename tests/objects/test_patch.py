import base64
import datetime
import enum
import json

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures.builders import (DECISIONS, HOSTNAME, LEAF, PIN, USER_TERM, container, decision, deep,
                                     schema_error, workload)
from webhook.objects.kinds import BY_KEY
from webhook.objects import mutation, patch
from webhook.settings.config import Config

CONFIG = Config()


def test_annotation_keys_are_escaped_when_annotations_exist():
    obj = workload("Job", template_annotations={"team": "ml"})
    ops = patch.make_patch(obj, mutation.mutate(obj, BY_KEY["Job"], decision(), CONFIG, "k"))
    paths = {op["path"] for op in ops}
    assert "/spec/template/metadata/annotations/topology.scheduler~1placement" in paths
    assert "/spec/template/metadata/annotations/topology.scheduler~1injected" in paths


def test_missing_parents_are_added_whole():
    obj = workload("Job")
    ops = patch.make_patch(obj, mutation.mutate(obj, BY_KEY["Job"], decision(), CONFIG, "k"))
    adds = {op["path"]: op["value"] for op in ops if op["op"] == "add"}
    assert set(adds["/spec/template/metadata"]["annotations"]) == {
        mutation.PLACEMENT, mutation.GPU_IDS, mutation.RESERVATION, mutation.INJECTED}
    assert adds["/spec/template/spec/affinity"]["nodeAffinity"]
    assert adds["/spec/template/spec/containers/0/env"] == [
        {"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"}, {"name": "NCCL_P2P_LEVEL", "value": "NVL"}]


def test_tilde_in_a_key_is_escaped_first():
    ops = patch.make_patch({"metadata": {"annotations": {"x": "1"}}},
                           {"metadata": {"annotations": {"x": "1", "a~b/c": "2"}}})
    assert ops == [{"op": "add", "path": "/metadata/annotations/a~0b~1c", "value": "2"}]


def test_a_yaml_timestamp_does_not_break_the_patch():
    obj = workload("Job")
    obj["metadata"]["creationTimestamp"] = datetime.datetime(2026, 1, 2, tzinfo=datetime.timezone.utc)
    mutated = mutation.mutate(obj, BY_KEY["Job"], decision(), CONFIG, "k")
    ops = patch.make_patch(obj, mutated)
    assert jsonpatch.apply_patch(obj, ops) == mutated


def test_values_json_has_not_are_patched_as_json_writes_them():
    """A str enum by its value, a datetime by its text (as the old json.dumps(default=str) did),
    and a datetime changed to its own text is no change."""
    class Tier(str, enum.Enum):
        GOLD = "gold"
    at = datetime.datetime(2026, 1, 2, tzinfo=datetime.timezone.utc)
    ops = patch.make_patch({"metadata": {}}, {"metadata": {"tier": Tier.GOLD, "at": at}})
    assert sorted((op["path"], op["value"]) for op in ops) == [("/metadata/at", str(at)), ("/metadata/tier", "gold")]
    assert patch.make_patch({"metadata": {"at": at}}, {"metadata": {"at": str(at)}}) == []


def test_equal_objects_give_no_operations():
    obj = workload("Job")
    assert patch.make_patch(obj, deep(obj)) == []


def test_a_patch_that_does_not_reproduce_the_mutated_object_is_refused(monkeypatch):
    wrong = jsonpatch.JsonPatch([{"op": "add", "path": "/metadata/labels", "value": {"x": "y"}}])
    monkeypatch.setattr(patch.jsonpatch.JsonPatch, "from_diff", lambda *args, **options: wrong)
    with pytest.raises(patch.PatchError, match="does not give the mutated object"):
        patch.make_patch({"metadata": {}}, {"metadata": {"annotations": {}}})


def test_a_patch_that_does_not_apply_is_refused(monkeypatch):
    broken = jsonpatch.JsonPatch([{"op": "replace", "path": "/metadata/annotations/x", "value": "y"}])
    monkeypatch.setattr(patch.jsonpatch.JsonPatch, "from_diff", lambda *args, **options: broken)
    with pytest.raises(patch.PatchError, match="does not apply"):
        patch.make_patch({"metadata": {}}, {"metadata": {"annotations": {"x": "y"}}})


def test_pods_changed_alike_share_one_patch_made_once_and_each_gets_its_own_copy():
    """A group's members differ in what we leave alone (their names) and change alike: the patch
    is made and checked once, and what one caller does to its operations is not the next one's."""
    members = [workload("Pod", name=f"train-{i}") for i in range(3)]
    made = [patch.make_patch(pod, mutation.mutate(pod, BY_KEY["Pod"], decision(), CONFIG, "ml/PyTorchJob/train"))
            for pod in members[:2]]
    assert made[0] == made[1] and made[0]
    assert patch._checked_operations.cache_info().hits == 1
    kept = json.loads(json.dumps(made[0]))
    for operation in made[1]:
        operation["path"] = "/elsewhere"
        if isinstance(operation.get("value"), dict):
            operation["value"].clear()
    third = mutation.mutate(members[2], BY_KEY["Pod"], decision(), CONFIG, "ml/PyTorchJob/train")
    again = patch.make_patch(members[2], third)
    assert again == kept and jsonpatch.apply_patch(members[2], again) == third


def test_pods_placed_alike_on_other_nodes_share_one_patch_with_their_own_strings_put_back():
    """Two users' pods, each placed alone on a node and leaf of its own: one patch is made and
    checked, and each pod gets it with its own name, node and leaf in it."""
    pods = [workload("Pod", name=name) for name in ("alpha", "beta")]
    mutated = [mutation.mutate(pods[0], BY_KEY["Pod"], decision(leaf="leaf-3", nodes=("gpu-1",)), CONFIG, "ml/Pod/alpha"),
               mutation.mutate(pods[1], BY_KEY["Pod"], decision(leaf="leaf-7", nodes=("gpu-9",)), CONFIG, "ml/Pod/beta")]
    made = [patch.make_patch(pod, wanted) for pod, wanted in zip(pods, mutated)]
    assert patch._checked_operations.cache_info().hits == 1
    assert [jsonpatch.apply_patch(pod, ops) for pod, ops in zip(pods, made)] == mutated
    assert "leaf-7" in json.dumps(made[1]) and "leaf-3" not in json.dumps(made[1])


def test_an_item_changed_inside_a_list_is_patched_inside_it():
    received = {"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}}
    mutated = {"spec": {"containers": [{"name": "a", "image": "x"},
                                       {"name": "b", "image": "y", "env": [{"name": "E", "value": "1"}]}]}}
    assert patch.make_patch(received, mutated) == [
        {"op": "add", "path": "/spec/containers/1/env", "value": [{"name": "E", "value": "1"}]}]


# Every scalar an API object holds: int64 (the API's widest integer), finite floats, any text.
_scalars = (st.none() | st.booleans() | st.integers(-3, 3) | st.integers(-2**63, 2**63 - 1)
            | st.floats(allow_nan=False, allow_infinity=False) | st.text("ab/~", max_size=3) | st.text(max_size=3))
_json = st.recursive(_scalars,
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text("ab/~0", max_size=3), inner,
                                                                                 max_size=3), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(_json, _json)
def test_any_two_documents_give_a_patch_from_one_to_the_other(received, mutated):
    # the diff walks only the parts that differ: what it leaves out must not change what the patch does
    document = json.loads(json.dumps({"metadata": received, "spec": [received, mutated]}))
    wanted = json.loads(json.dumps({"metadata": mutated, "spec": [mutated, received]}))
    ops = patch.make_patch(document, wanted)
    assert jsonpatch.apply_patch(document, json.loads(json.dumps(ops))) == wanted


# one to one (equal strings stay equal, others other): what the memo must see through
_renames = st.sampled_from([lambda text: text * 2, lambda text: text + "~/x", lambda text: "x" + text[::-1]])


@settings(max_examples=200, deadline=None)
@given(_json, _json, _renames)
def test_a_patch_remembered_for_one_pair_of_documents_is_right_for_the_same_shape_with_other_strings(
        received, mutated, rename):
    """What the memo reuses: the same documents but for their strings (renamed one to one, so
    equal stay equal) give the same patch shape, and each its own strings."""
    def renamed(doc):
        if isinstance(doc, dict):
            return {key: renamed(value) for key, value in doc.items()}
        if isinstance(doc, list):
            return [renamed(value) for value in doc]
        return rename(doc) if isinstance(doc, str) else doc
    first = {"metadata": received, "spec": [received, mutated]}
    first_wanted = {"metadata": mutated, "spec": [mutated, received]}
    patch.make_patch(first, first_wanted)
    second, second_wanted = renamed(first), renamed(first_wanted)
    hits = patch._checked_operations.cache_info().hits
    ops = patch.make_patch(second, second_wanted)
    assert jsonpatch.apply_patch(second, json.loads(json.dumps(ops))) == second_wanted
    assert ops == [] or patch._checked_operations.cache_info().hits > hits


@settings(max_examples=200, deadline=None)
@given(st.lists(_json, min_size=1, max_size=6), st.lists(_json, min_size=1, max_size=4), _json,
       st.text(alphabet="ab/~01", min_size=1, max_size=4))
def test_a_list_only_appended_to_is_patched_by_adding_after_its_items(kept, added, beside, key):
    # our env after a user's: the user's items are never written, moved or matched up
    received = {"spec": {"containers": [{"name": "main", key: kept}], "beside": beside}}
    mutated = {"spec": {"containers": [{"name": "main", key: kept + added}], "beside": beside}}
    ops = patch.make_patch(received, mutated)
    assert jsonpatch.apply_patch(received, ops) == mutated
    pointer = key.replace("~", "~0").replace("/", "~1")
    assert [(op["op"], op["path"]) for op in ops] == [
        ("add", f"/spec/containers/0/{pointer}/{len(kept) + i}") for i in range(len(added))]


def test_the_items_a_list_keeps_never_reach_the_diff(monkeypatch):
    """A user's 20,000 env variables and our two after them: two adds, and jsonpatch sees only
    what else changed (it serialized every kept item to match the lists up)."""
    diffed = []
    real_diff = jsonpatch.JsonPatch.from_diff

    def recorded(received, mutated, **options):
        diffed.append((received, mutated))
        return real_diff(received, mutated, **options)
    monkeypatch.setattr(patch.jsonpatch.JsonPatch, "from_diff", recorded)
    patch._checked_operations.cache_clear()
    env = [{"name": f"SETTING_{i}", "value": str(i)} for i in range(20_000)]
    ours = [{"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"}, {"name": "NCCL_P2P_LEVEL", "value": "NVL"}]
    received = {"metadata": {"annotations": {"team": "a"}}, "spec": {"containers": [{"name": "main", "env": env}]}}
    mutated = {"metadata": {"annotations": {"team": "a", "topology.scheduler/placement": "here"}},
               "spec": {"containers": [{"name": "main", "env": env + ours}]}}
    ops = patch.make_patch(received, mutated)
    assert ops == [{"op": "add", "path": "/metadata/annotations/topology.scheduler~1placement", "value": "here"},
                   {"op": "add", "path": "/spec/containers/0/env/20000", "value": ours[0]},
                   {"op": "add", "path": "/spec/containers/0/env/20001", "value": ours[1]}]
    assert jsonpatch.apply_patch(received, ops) == mutated
    assert "SETTING_0" not in json.dumps(diffed)


def test_encode_is_base64_of_the_json_array():
    ops = [{"op": "add", "path": "/a~1b", "value": "é"}]
    assert json.loads(base64.b64decode(patch.encode(ops))) == ops


# -- property: random user settings under every decision ------------------------------------------------

_NAMES = ("NCCL_P2P_LEVEL", "CUDA_DEVICE_ORDER", "NCCL_DEBUG", "NCCL_CROSS_NIC", "OMP_NUM_THREADS")
_EXPRESSIONS = (PIN, USER_TERM, {"key": LEAF, "operator": "In", "values": ["leaf-3", "leaf-4"]},
                {"key": "pool", "operator": "Exists"})
_PAIRS = [(k, w) for k in (HOSTNAME, LEAF, "topology.kubernetes.io/zone") for w in ("DoNotSchedule", "ScheduleAnyway")]
_values = st.text(alphabet="abcXYZ019-_./~ ", max_size=12)


@st.composite
def user_jobs(draw) -> tuple[str, dict]:
    kind = draw(st.sampled_from(["Job", "Pod", "Deployment", "CronJob"]))
    env = [{"name": n, "value": draw(_values)} for n in draw(st.lists(st.sampled_from(_NAMES), unique=True))]
    containers = [container(env=env if draw(st.booleans()) else None),
                  container("helper", gpus=draw(st.sampled_from([0, 1])))]
    spec: dict = {}
    terms = draw(st.lists(st.lists(st.sampled_from(_EXPRESSIONS), min_size=1, max_size=2, unique_by=json.dumps),
                          max_size=2))
    preferred = draw(st.lists(st.sampled_from(_EXPRESSIONS), max_size=2, unique_by=json.dumps))
    node_affinity: dict = {}
    if terms:
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}
    if preferred:
        node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": 10, "preference": {"matchExpressions": [e]}} for e in preferred]
    if node_affinity:
        spec["affinity"] = {"nodeAffinity": node_affinity}
    pairs = draw(st.lists(st.sampled_from(_PAIRS), unique=True, max_size=3))
    if pairs:
        spec["topologySpreadConstraints"] = [
            {"maxSkew": 1, "topologyKey": k, "whenUnsatisfiable": w, "labelSelector": {"matchLabels": {"app": "x"}}}
            for k, w in pairs]
    if draw(st.booleans()):
        spec["schedulerName"] = draw(st.sampled_from(["topology-aware-scheduler", "default-scheduler"]))
    annotations = draw(st.dictionaries(st.sampled_from(["team", "a/b", "x~y", "topology.scheduler/gpu-count",
                                                        mutation.PLACEMENT]), _values, max_size=3))
    labels = draw(st.dictionaries(st.sampled_from(["app", mutation.WORKLOAD_LABEL]), st.just("train"), max_size=2))
    obj = workload(kind, replicas=2 if kind != "Pod" else None, containers=containers, spec=spec,
                   template_annotations=annotations, labels=labels)
    return kind, json.loads(json.dumps(obj))  # as the apiserver sends it: no shared sub-objects


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(user_jobs(), st.sampled_from(sorted(DECISIONS)))
def test_patch_applies_to_the_received_object_and_a_second_pass_is_a_no_op(job, name):
    kind, received = job
    kept = deep(received)
    mutated = mutation.mutate(received, BY_KEY[kind], DECISIONS[name], CONFIG, "ml/Job/train")
    ops = json.loads(json.dumps(patch.make_patch(received, mutated)))  # as the apiserver decodes it
    assert jsonpatch.apply_patch(received, ops) == mutated
    assert received == kept
    assert patch.make_patch(mutated, mutation.mutate(mutated, BY_KEY[kind], DECISIONS[name], CONFIG, "ml/Job/train")) == []
    assert schema_error(mutated) is None


@settings(max_examples=60, deadline=None)
@given(user_jobs(), st.sampled_from(sorted(DECISIONS)), st.sampled_from(sorted(DECISIONS)))
def test_replacing_a_decision_still_patches_exactly(job, first, second):
    kind, received = job
    placed = mutation.mutate(received, BY_KEY[kind], DECISIONS[first], CONFIG, "k")
    again = mutation.mutate(placed, BY_KEY[kind], DECISIONS[second], CONFIG, "k")
    assert jsonpatch.apply_patch(placed, patch.make_patch(placed, again)) == again
    assert mutation.mutate(again, BY_KEY[kind], DECISIONS[second], CONFIG, "k") == again
