"""Waits held by a scheduling gate (`gate_waits`): what the mutation writes on a wait, and what
`released` writes when the releaser lets it go."""
import dataclasses
import json

import pytest

from tests.fixtures.builders import PIN, USER_TERM, decision, deep, request, subject_of, template_of, valid, workload
from webhook.objects.kinds import BY_KEY
from webhook.core import injection
from webhook.settings.config import Config
from webhook.placement import enforce
from webhook.core.model import Outcome, Strategy
from webhook.objects import mutation
from webhook.objects.feed import gated

GATED = Config(gate_waits=True)
GATE = {"name": injection.GATE}


def waiting(strategy=Strategy.CONSOLIDATED, config=GATED, **change):
    """A wait for room, held as `config` says once `change` is made to it."""
    return enforce.enforced(dataclasses.replace(decision(request(pods=2, strategy=strategy), Outcome.WAIT), **change),
                            config)


def spec_of(obj):
    return template_of(obj)["spec"]


def annotations(obj):
    return template_of(obj).get("metadata", {}).get("annotations", {})


def test_a_pinned_wait_for_room_is_gated_instead_of_pinned():
    user_gate = {"name": "example.com/quota"}
    obj = workload("Job", spec={"schedulingGates": [user_gate], "affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [USER_TERM]}]}}}})
    out = valid(mutation.mutate(obj, BY_KEY["Job"], waiting(), GATED, "ml/Job/train"))
    spec = spec_of(out)
    assert spec["schedulingGates"] == [user_gate, GATE]
    assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"] == [{"matchExpressions": [USER_TERM]}]  # no pin: the releaser writes it
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in spec["affinity"]["nodeAffinity"]
    assert annotations(out)[injection.WAITING_FOR].endswith("topology.scheduler/leaf=leaf-3")  # protection sees it
    assert injection.loads_request(annotations(out)[injection.GATED_REQUEST]) == waiting().request
    assert "held by scheduling gate topology.scheduler/placement" in mutation.warnings(waiting())[0]
    assert mutation.mutate(out, BY_KEY["Job"], waiting(), GATED, "ml/Job/train") == out  # our own output: no change


@pytest.mark.parametrize("wait, config", [
    pytest.param(waiting(config=Config(gate_waits=False)), Config(gate_waits=False), id="gate_waits off: pinned as before"),
    pytest.param(waiting(code="GrowsPool"), GATED, id="a wait for a pool to grow: gates never trigger autoscalers"),
    pytest.param(waiting(code="ExceedsNodes"), GATED, id="a wait for nodes to be added"),
    pytest.param(waiting(request=dataclasses.replace(request(pods=2), may_pin_wait=False)), GATED,
                 id="a Deployment's wait: its template would gate every pod for good"),
    pytest.param(waiting(Strategy.DISTRIBUTED), GATED, id="a wait that only prefers its domain"),
])
def test_other_waits_are_never_gated(wait, config):
    out = valid(mutation.mutate(workload("Job"), BY_KEY["Job"], wait, config))
    assert "schedulingGates" not in spec_of(out) and injection.GATED_REQUEST not in annotations(out)


def test_a_placement_after_a_gated_wait_removes_only_our_gate():
    user_gate = {"name": "example.com/quota"}
    gated = mutation.mutate(workload("Job", spec={"schedulingGates": [user_gate]}), BY_KEY["Job"], waiting(), GATED)
    placed = valid(mutation.mutate(gated, BY_KEY["Job"], decision(request(pods=2)), GATED))
    assert spec_of(placed)["schedulingGates"] == [user_gate]
    assert injection.GATED_REQUEST not in annotations(placed) and injection.WAITING_FOR not in annotations(placed)
    assert mutation.without_injection(subject_of(gated)).obj == workload("Job", spec={"schedulingGates": [user_gate]})


def test_a_gate_of_our_name_that_we_did_not_add_is_left_alone():
    obj = workload("Job", spec={"schedulingGates": [dict(GATE)]})
    assert spec_of(mutation.mutate(obj, BY_KEY["Job"], decision(request(pods=2)), GATED))["schedulingGates"] == [GATE]


def gated_pod(**spec):
    job = mutation.mutate(workload("Job", spec=deep(spec)), BY_KEY["Job"], waiting(), GATED, "ml/Job/train")
    template = template_of(job)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {**deep(template["metadata"]), "name": "train-0",
                                                              "namespace": "ml", "ownerReferences": [JOB_OWNER]},
            "spec": deep(template["spec"])}


JOB_OWNER = {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "uid-train", "controller": True}


def test_released_narrows_the_affinity_writes_the_gpus_and_lifts_only_our_gate():
    user_gate = {"name": "example.com/quota"}
    pod = gated_pod(schedulingGates=[user_gate], affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [USER_TERM]}]}}})
    placed = decision(request(pods=2, strategy=Strategy.BALANCED), nodes=("gpu-1", "gpu-2"))
    out = valid(mutation.released(pod, placed, Config().seal_key))
    assert out["spec"]["schedulingGates"] == [user_gate]
    assert out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"] == [{"matchExpressions": [USER_TERM, PIN]}]  # only added to: the API's rule for gated pods
    assert out["spec"]["containers"] == pod["spec"]["containers"]  # fixed at creation
    meta = out["metadata"]["annotations"]
    assert injection.WAITING_FOR not in meta and injection.GATED_REQUEST not in meta
    assert meta[injection.RESERVATION] == "ml/Job/train" and meta[injection.PLACEMENT].startswith("balanced in leaf")
    assert injection.recorded(out).required == ((PIN,),) and not injection.recorded(out).gated
    assert mutation.without_injection(subject_of(out)).obj["spec"]["schedulingGates"] == [user_gate]


def test_a_request_survives_its_annotation_and_a_foreign_one_reads_as_none():
    asked = dataclasses.replace(request(pods=4), max_domain="leaf", node_selector={"pool": "gpu"},
                                required_node_terms=({"matchExpressions": [USER_TERM]},),
                                tolerations=({"key": "gpu", "operator": "Exists"},), resources=(("cpu", 4000),),
                                min_bandwidth_gbps=400.0, latency_sensitive=True)
    assert injection.loads_request(injection.dumps_request(asked)) == asked
    steered = dataclasses.replace(asked, search_first=(("topology.scheduler/leaf", "leaf-1"),))
    assert injection.dumps_request(steered) == injection.dumps_request(asked), \
        "a replica's allotment is not the workload's: older replicas must read the record too"
    for foreign in ("", "[]", "{}", '{"pods": 2}', "not json", None):
        assert injection.loads_request(foreign) is None


# -- which gated workloads the releaser decides (state/gated.py) -------------------------------

KEY = GATED.seal_key


def note(pods, key, pod, now, seal_key=KEY):
    """What the index does with a pod it reads: the feed reads its gate, the gated pods keep it."""
    return pods.note(key, gated(pod, seal_key), pod, now)


def sealed(pod):
    """The pod with its record sealed as the webhook seals it (for records a test writes itself)."""
    meta = pod["metadata"]["annotations"]
    meta[injection.GATE_SEAL] = injection.seal_gate(KEY, meta[injection.RESERVATION], meta[injection.GATED_REQUEST],
                                                    meta[injection.WAITING_FOR])
    return pod


def pod_named(name, **changes):
    """A gated pod of a Job (ml/Job/train, or the one a changed reservation names, as its controller)."""
    pod = gated_pod()
    pod["metadata"]["name"] = name
    pod["metadata"]["annotations"].update(changes)
    job = pod["metadata"]["annotations"][injection.RESERVATION].rpartition("/")[2]
    pod["metadata"]["ownerReferences"] = [{**JOB_OWNER, "name": job, "uid": f"uid-{job}"}]
    return sealed(pod)


GROUP = "ml/Job/train@uid-train"  # its pods' group: the Job's reservation key, and that Job's uid


def test_a_gated_workload_is_ready_once_all_its_pods_exist_and_a_replacement_starts_alone():
    from webhook.state.gated import GatedPods
    pods = GatedPods()
    assert note(pods, "a/train-1", pod_named("train-1"), now=5.0)
    assert pods.ready({}) == []  # 1 of its 2 pods: its controller is still making them
    assert not note(pods, "a/train-1", pod_named("train-1"), now=9.0)  # seen before: keeps its time
    note(pods, "a/train-0", pod_named("train-0"), now=7.0)
    (group,) = pods.ready({})
    assert [p.name for p in group.pods] == ["train-0", "train-1"] and group.request.pods == 2
    assert min(p.since for p in group.pods) == 5.0
    pods.forget("a/train-0")
    (alone,) = pods.ready({"ml/Job/train": 1})  # its sibling runs: the replacement is decided alone
    assert alone.request.pods == 1 and [p.name for p in alone.pods] == ["train-1"]


def test_pods_not_held_by_our_gate_or_unreadable_are_not_kept():
    from webhook.state.gated import GatedPods
    pod = gated_pod()
    assert isinstance(gated(pod, KEY), injection.GateRecord)
    lifted = deep(pod)
    lifted["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    unreadable = deep(pod)
    unreadable["metadata"]["annotations"][injection.GATED_REQUEST] = "{}"
    pods = GatedPods()
    assert gated(lifted, KEY) is None and not note(pods, "a", lifted, now=0.0)
    assert "does not match" in gated(unreadable, KEY) and not note(pods, "b", unreadable, now=0.0)
    assert len(pods) == 0 and list(pods.refused) == ["b"]  # kept apart, to be reported


def test_groups_are_decided_oldest_first():
    from webhook.state.gated import GatedPods
    pods = GatedPods()
    for key, reservation, now in (("p1", "ml/Job/late", 9.0), ("p2", "ml/Job/early", 1.0)):
        for index in range(2):
            note(pods, f"{key}-{index}", pod_named(f"{key}-{index}", **{injection.RESERVATION: reservation}), now)
    assert [g.reservation for g in pods.ready({})] == ["ml/Job/early", "ml/Job/late"]
    assert pods.waited(now=10.0) == (4, 9.0)  # what topology_gated_pod_oldest_wait_seconds says


# -- what a release decides from is only what we sealed ------------------------------------------

@pytest.mark.parametrize("field, value", [
    (injection.GATED_REQUEST, '{"pods": 0}'),
    (injection.GATED_REQUEST, None),  # filled in below with a request of 0 pods, sealed
    (injection.WAITING_FOR, "topology.scheduler/leaf=leaf-0"),
    (injection.RESERVATION, "ml/Job/other"),
    (injection.GATE_SEAL, "forged"),
])
def test_an_edited_record_is_refused_and_never_decided(field, value):
    from webhook.state.gated import GatedPods
    pod = gated_pod()
    if value is None:  # a request the core cannot decide fails even under a valid seal
        text = pod["metadata"]["annotations"][injection.GATED_REQUEST].replace('"pods":2', '"pods":0')
        pod["metadata"]["annotations"][injection.GATED_REQUEST] = text
        sealed(pod)
    else:
        pod["metadata"]["annotations"][field] = value
    pods = GatedPods()
    assert not note(pods, "ml/train-0", pod, now=0.0)
    assert pods.ready({}) == [] and "ml/train-0" in pods.refused
    assert note(GatedPods(), "x", gated_pod(), now=0.0, seal_key=b"another key") is False  # a key we do not hold: refused


@pytest.mark.parametrize("change", [
    {"pods": "2"}, {"pods": -1}, {"pods": 0}, {"gpus_per_pod": 2.5}, {"gpus_per_pod": True},
    {"required_node_terms": [{"matchExpressions": "x"}]}, {"required_node_terms": ["term"]},
    {"required_node_terms": [{"matchExpressions": [{"key": 1, "operator": "In"}]}]}, {"strategy": "fastest"},
])
def test_requests_that_cannot_be_decided_read_as_none(change):
    data = json.loads(injection.dumps_request(request(pods=2)))
    assert injection.loads_request(json.dumps(data)) is not None
    assert injection.loads_request(json.dumps({**data, **change})) is None


def test_a_record_names_only_its_own_namespace():
    pod = gated_pod()
    pod["metadata"]["namespace"] = "team-a"  # copied, seal and all, from namespace ml
    assert "outside namespace team-a" in injection.gate_record(pod["metadata"]["annotations"], "team-a", KEY)


def test_a_gated_workload_follows_its_owners_size():
    from webhook.state.gated import GatedPods
    pods = GatedPods()
    for i in range(3):  # a Job decided for 2 pods, scaled to 3 while gated
        note(pods, f"ml/train-{i}", pod_named(f"train-{i}"), now=float(i))
    assert list(pods.unsure({})) == [GROUP]
    assert [len(g.pods) for g in pods.ready({})] == [3]  # without its owner's word: the pods made
    assert [len(g.pods) for g in pods.ready({}, sizes={GROUP: 2})] == [2]  # the owner's word wins
    (group,) = pods.ready({}, sizes={GROUP: 3})
    assert group.request.pods == 3 and len(group.pods) == 3 and group.hold == "ml/Job/train"
    pods.forget("ml/train-2")  # bound elsewhere, say: not a deletion
    pods.forget("ml/train-1")
    assert pods.ready({}) == []  # 1 of 2: as if its controller were still making them
    (group,) = pods.ready({}, sizes={GROUP: 1})
    assert group.request.pods == 1 and [p.name for p in group.pods] == ["train-0"]
    # released, then scaled up again: the new pod joins under a hold of its own, and the one
    # released is not decided again
    note(pods, "ml/train-5", pod_named("train-5"), now=9.0)
    (group,) = pods.ready({}, started={"ml/train-0"}, sizes={GROUP: 2})
    assert [p.name for p in group.pods] == ["train-5"] and group.request.pods == 1
    assert group.hold == "ml/Job/train+train-5"


def test_without_its_owners_word_a_workload_waits_for_as_many_fewer_as_were_deleted_while_gated():
    from webhook.state.gated import GatedPods
    pods = GatedPods()
    for i in range(2):
        note(pods, f"ml/train-{i}", pod_named(f"train-{i}"), now=float(i))
    pods.deleted("ml/train-1")  # its Job scaled 2 to 1
    (group,) = pods.ready({})
    assert group.request.pods == 1 and [p.name for p in group.pods] == ["train-0"]
    pods.deleted("ml/train-0")
    assert not pods.removed  # the workload is gone: nothing of it is kept


def test_a_release_changes_only_gates_affinity_and_our_annotations_whatever_the_record_claims():
    """The record (`injected`) is the pod owner's to edit: one claiming env, a label or an
    expression of the user's as ours must not make the release touch containers, labels, or
    widen the affinity, which the apiserver refuses (a stranded release)."""
    pod = gated_pod(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [USER_TERM]}]}}})
    pod["metadata"]["labels"] = {"app": "x"}
    record = injection.recorded(pod)
    forged = dataclasses.replace(record, env={"trainer": {"FORGED": "1"}}, label="forged",
                                 required=((USER_TERM,),))
    pod["metadata"]["annotations"][injection.INJECTED] = forged.dumps()
    placed = decision(request(pods=2), nodes=("gpu-1", "gpu-2"))
    out = mutation.released(pod, placed, Config().seal_key)
    assert out["spec"]["containers"] == pod["spec"]["containers"] and out["metadata"]["labels"] == {"app": "x"}
    terms = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [{"matchExpressions": [USER_TERM, PIN]}]  # narrowed, nothing removed
    assert "schedulingGates" not in out["spec"]
    changed = {k for k in set(out) | set(pod) if out.get(k) != pod.get(k)}
    assert changed <= {"spec", "metadata"}
    assert {k for k in out["spec"] if out["spec"].get(k) != pod["spec"].get(k)} <= {"schedulingGates", "affinity"}


def test_a_replacement_for_a_pod_deleted_while_gated_restores_the_size():
    from webhook.state.gated import GatedPods
    pods = GatedPods()
    for i in range(2):
        note(pods, f"ml/train-{i}", pod_named(f"train-{i}"), now=float(i))
    pods.deleted("ml/train-1")  # deleted by hand: its Job makes a replacement
    note(pods, "ml/train-2", pod_named("train-2"), now=5.0)
    (group,) = pods.ready({})
    assert group.request.pods == 2 and [p.name for p in group.pods] == ["train-0", "train-2"]


# -- groups by owner: a Job created again under its name, and copies of its pods (issue 59) ---------

def test_a_job_created_again_under_its_name_starts_a_group_its_old_pods_neither_join_nor_shrink():
    from webhook.state.gated import GatedPods
    pods = GatedPods()
    old, new = [], []
    for i in range(2):
        old.append(pod_named(f"old-{i}"))
        note(pods, f"ml/old-{i}", old[-1], now=1.0)
    for i in range(2):  # the same name, another Job: another uid
        pod = pod_named(f"new-{i}")
        pod["metadata"]["ownerReferences"][0]["uid"] = "uid-train-again"
        new.append(pod)
        note(pods, f"ml/new-{i}", pod, now=2.0)
    assert sorted(g.group for g in pods.ready({})) == ["ml/Job/train@uid-train", "ml/Job/train@uid-train-again"]
    for i in range(2):  # the garbage collector deletes the old Job's pods
        pods.deleted(f"ml/old-{i}")
    (group,) = pods.ready({})
    assert group.group == "ml/Job/train@uid-train-again" and [p.name for p in group.pods] == ["new-0", "new-1"]


@pytest.mark.parametrize("owner, why", [
    ({"kind": "Job", "name": "other", "uid": "uid-other"}, "made by Job other"),  # a copy put under another Job
    (None, "made by no controller"),  # a copy with its owner stripped
])
def test_a_copy_of_a_jobs_pod_under_another_owner_or_none_is_refused_and_joins_nothing(owner, why):
    from webhook.state.gated import GatedPods
    pods = GatedPods()
    for i in range(2):
        note(pods, f"ml/train-{i}", pod_named(f"train-{i}"), now=1.0)
    copy = pod_named("aaa-copy")  # named to sort first
    copy["metadata"]["ownerReferences"] = [{**JOB_OWNER, **owner}] if owner else []
    assert not note(pods, "ml/aaa-copy", copy, now=2.0)
    (refused, reason) = pods.refused["ml/aaa-copy"]
    assert "its reservation names Job train" in reason and why in reason
    (group,) = pods.ready({})
    assert [p.name for p in group.pods] == ["train-0", "train-1"]
