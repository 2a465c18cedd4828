import dataclasses
import json

import pytest

from tests.fixtures.builders import (API_VERSIONS, DECISIONS, HOSTNAME, LEAF, PIN, USER_TERM, container, decision, deep,
                                     request, subject_of, template_of, valid, workload)
from webhook.core.injection import waited_domain
from webhook.objects.kinds import BY_KEY
from webhook.core import injection
from webhook.placement import enforce
from webhook.objects import mutation, provisioning
from webhook.settings.config import Config
from webhook.core.model import Interconnect, Outcome, Strategy
from webhook.objects.templates import pod_template, pod_templates

CONFIG = Config()


def node_affinity(obj: dict) -> dict:
    return template_of(obj)["spec"].get("affinity", {}).get("nodeAffinity", {})


def env_of(obj: dict, name: str) -> dict:
    spec = template_of(obj)["spec"]
    found = next(c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == name)
    return {e["name"]: e.get("value") for e in found.get("env", [])}


def annotations(obj: dict) -> dict:
    return template_of(obj).get("metadata", {}).get("annotations", {})


def test_consolidated_pins_by_adding_to_every_existing_term():
    terms = [{"matchExpressions": [USER_TERM]}, {"matchFields": [{"key": "metadata.name", "operator": "In",
                                                                  "values": ["gpu-1"]}]}]
    obj = workload("Job", spec={"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": deep(terms)}}}})
    out = valid(mutation.mutate(obj, BY_KEY["Job"], decision(), CONFIG, "ml/Job/train"))
    got = node_affinity(out)["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert got == [{"matchExpressions": [USER_TERM, PIN]}, {**terms[1], "matchExpressions": [PIN]}]
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in node_affinity(out)


def test_consolidated_without_affinity_gets_one_term():
    out = valid(mutation.mutate(workload("Job"), BY_KEY["Job"], decision(), CONFIG))
    assert node_affinity(out) == {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [PIN]}]}}


@pytest.mark.parametrize("strategy, outcome, settings, pinned", [
    pytest.param(Strategy.CONSOLIDATED, Outcome.PLACED, {}, True, id="consolidated placed pins"),
    pytest.param(Strategy.DISTRIBUTED, Outcome.PLACED, {}, True, id="distributed placed pins its scope"),
    pytest.param(Strategy.BALANCED, Outcome.PLACED, {}, False, id="balanced placed prefers"),
    pytest.param(Strategy.CONSOLIDATED, Outcome.WAIT, {"gate_waits": False}, True,
                 id="consolidated waiting pins where it waits"),
    pytest.param(Strategy.CONSOLIDATED, Outcome.WAIT, {"pin_when_waiting": False}, False,
                 id="consolidated waiting prefers when configured"),
    pytest.param(Strategy.BALANCED, Outcome.WAIT, {"gate_waits": False}, True, id="balanced waiting pins where waiting pays"),
    pytest.param(Strategy.BALANCED, Outcome.WAIT, {"pin_only_where_locality_pays": False}, False,
                 id="balanced waiting only prefers when waits are not weighed"),
    pytest.param(Strategy.BALANCED, Outcome.WAIT, {"pin_when_waiting": False}, False,
                 id="balanced waiting prefers when configured"),
    pytest.param(Strategy.DISTRIBUTED, Outcome.WAIT, {}, False, id="distributed waiting only prefers"),
])
def test_required_or_preferred(strategy, outcome, settings, pinned):
    config = Config(**settings)
    obj = workload("Job", spec={"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 5, "preference": {"matchExpressions": [USER_TERM]}}]}}})
    out = valid(mutation.mutate(obj, BY_KEY["Job"], decision(request(strategy=strategy), outcome, config=config), config))
    affinity = node_affinity(out)
    preferred = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    if pinned:
        assert affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
            {"matchExpressions": [PIN]}]
        assert len(preferred) == 1
    else:
        assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity
        assert preferred[1] == {"weight": Config().preferred_weight, "preference": {"matchExpressions": [PIN]}}
    assert preferred[0]["weight"] == 5  # the user's preference stays first and unchanged


@pytest.mark.parametrize("change", [
    pytest.param({"code": "GrowsPool"}, id="a wait for nodes a pool adds"),
    pytest.param({"locality_pays": False}, id="a wait where locality does not pay"),
])
def test_a_balanced_wait_stays_a_preference_unless_it_waits_for_room_where_waiting_pays(change):
    waiting = dataclasses.replace(decision(request(strategy=Strategy.BALANCED), Outcome.WAIT), **change)
    assert enforce.pins(dataclasses.replace(waiting, code="NoRoomNow", locality_pays=True), CONFIG)
    assert not enforce.pins(waiting, CONFIG) and waited_domain(enforce.enforced(waiting, CONFIG)) is None


def test_the_preference_weight_is_a_setting():
    obj = workload("Job", spec={})
    out = valid(mutation.mutate(obj, BY_KEY["Job"], decision(request(strategy=Strategy.BALANCED)), Config(preferred_weight=40)))
    assert [p["weight"] for p in node_affinity(out)["preferredDuringSchedulingIgnoredDuringExecution"]] == [40]


def test_waiting_warnings_say_what_happens():
    waiting = decision(request(strategy=Strategy.CONSOLIDATED), Outcome.WAIT)
    assert "held by scheduling gate topology.scheduler/placement until leaf leaf-3" in mutation.warnings(waiting)[0]
    assert "pinned to leaf leaf-3" in mutation.warnings(enforce.enforced(waiting, dataclasses.replace(CONFIG, gate_waits=False)))[0]
    assert "may start scattered" in mutation.warnings(enforce.enforced(waiting, Config(pin_when_waiting=False)))[0]


def test_several_pods_on_one_node_are_warned_about():
    crowded = decision(request(pods=4, gpus=2), nodes=("gpu-1",), pods_per_node=4)
    assert any("4 pods share node gpu-1" in w and "NVLink" in w for w in mutation.warnings(crowded))
    assert mutation.warnings(decision(request(pods=2), nodes=("gpu-1", "gpu-2"))) == ()


def test_distributed_spreads_with_a_selector_that_matches_the_pods():
    placed = decision(request(pods=4, strategy=Strategy.DISTRIBUTED), nodes=("a", "b", "c", "d"),
                      spread=(HOSTNAME, LEAF))
    out = valid(mutation.mutate(workload("Job", replicas=4), BY_KEY["Job"], placed, CONFIG))
    template = template_of(out)
    constraints = template["spec"]["topologySpreadConstraints"]
    assert [(c["topologyKey"], c["whenUnsatisfiable"]) for c in constraints] == [
        (HOSTNAME, "DoNotSchedule"), (LEAF, "ScheduleAnyway")]
    for constraint in constraints:
        selector = constraint["labelSelector"]["matchLabels"]
        assert selector.items() <= template["metadata"]["labels"].items()


def test_spread_never_duplicates_a_pair_the_user_has_and_uses_their_label():
    users = {"maxSkew": 2, "topologyKey": HOSTNAME, "whenUnsatisfiable": "DoNotSchedule",
             "labelSelector": {"matchLabels": {"app": "x"}}}
    obj = workload("Job", replicas=4, labels={mutation.WORKLOAD_LABEL: "mine"}, spec={"topologySpreadConstraints": [users]})
    placed = decision(request(pods=4, strategy=Strategy.DISTRIBUTED), nodes=("a", "b", "c", "d"),
                      spread=(HOSTNAME, LEAF))
    out = valid(mutation.mutate(obj, BY_KEY["Job"], placed, CONFIG))
    constraints = template_of(out)["spec"]["topologySpreadConstraints"]
    assert constraints[0] == users
    assert [c["topologyKey"] for c in constraints] == [HOSTNAME, LEAF]
    assert constraints[1]["labelSelector"] == {"matchLabels": {mutation.WORKLOAD_LABEL: "mine"}}
    assert template_of(out)["metadata"]["labels"][mutation.WORKLOAD_LABEL] == "mine"


def test_stacked_pods_do_not_block_on_the_hostname_spread():
    stacked = decision(request(pods=4, strategy=Strategy.DISTRIBUTED), nodes=("a", "b"), pods_per_node=2,
                       spread=(HOSTNAME,))
    out = mutation.mutate(workload("Job", replicas=4), BY_KEY["Job"], stacked, CONFIG)
    assert template_of(out)["spec"]["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "ScheduleAnyway"


@pytest.mark.parametrize("name", ["x" * 253, "Train.Job_v2", "a/b:c"], ids=["too long", "mixed case", "bad chars"])
def test_workload_label_is_a_valid_label_value(name):
    value = mutation.workload_label_value("Job", {"metadata": {"name": name}})
    assert len(value) <= 63 and value[0].isalnum() and value[-1].isalnum()
    assert all(c.isalnum() or c in "-_." for c in value)


def test_nccl_env_only_on_containers_that_request_gpus_and_never_over_the_users():
    obj = workload("Pod", annotations={"topology.scheduler/gpu-count": "8"}, containers=[
        container("trainer", gpus=8, env=[{"name": "NCCL_P2P_LEVEL", "value": "PIX"}]),
        container("logger", gpus=0)], spec={"initContainers": [
            container("fetch", gpus=0), container("gpu-sidecar", gpus=1, restartPolicy="Always")]})
    out = valid(mutation.mutate(obj, BY_KEY["Pod"], decision(), CONFIG))
    assert env_of(out, "trainer") == {"NCCL_P2P_LEVEL": "PIX", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert env_of(out, "gpu-sidecar") == {"NCCL_P2P_LEVEL": "NVL", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert env_of(out, "logger") == {} and env_of(out, "fetch") == {}


@pytest.mark.parametrize("interconnect", list(Interconnect), ids=lambda i: i.value)
def test_nccl_profile_follows_the_interconnect(interconnect):
    out = mutation.mutate(workload("Job"), BY_KEY["Job"], decision(interconnect=interconnect), CONFIG)
    assert env_of(out, "trainer") == {**CONFIG.nccl_profiles[interconnect.value], "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_gpu_ids_annotation_only_where_every_pod_gets_the_same_set():
    single = mutation.mutate(workload("Job"), BY_KEY["Job"], decision(), CONFIG)
    assert annotations(single)[mutation.GPU_IDS] == "0-7"
    whole_nodes = mutation.mutate(workload("Job", replicas=2), BY_KEY["Job"], decision(request(pods=2), nodes=("a", "b")),
                                  CONFIG)
    assert annotations(whole_nodes)[mutation.GPU_IDS] == "0-7"  # each pod all of its node's GPUs
    halves = decision(request(pods=2, gpus=4), nodes=("a",), pods_per_node=2)
    halves = dataclasses.replace(halves, assignment=(dataclasses.replace(
        halves.assignment[0], gpu_ids=((0, 1, 2, 3), (4, 5, 6, 7))),))
    two = mutation.mutate(workload("Job", replicas=2, gpus=4), BY_KEY["Job"], halves, CONFIG)
    assert mutation.GPU_IDS not in annotations(two)  # one template cannot tell each pod its own half
    assert "CUDA_VISIBLE_DEVICES" not in env_of(single, "trainer")


def test_annotations_summary_reservation_and_record():
    out = mutation.mutate(workload("Job"), BY_KEY["Job"], decision(), CONFIG, "ml/Job/train")
    notes = annotations(out)
    assert notes[mutation.PLACEMENT].startswith("consolidated in leaf leaf-3: 8 GPU(s) as 1 pod(s) x 8")
    assert notes[mutation.RESERVATION] == "ml/Job/train"
    assert json.loads(notes[mutation.INJECTED])["required_terms"] == [[PIN]]  # per term
    assert "\n" not in notes[mutation.PLACEMENT]


@pytest.mark.parametrize("scheduler, config, expected", [
    ("topology-aware-scheduler", Config(), "default-scheduler"),
    ("topology-aware-scheduler", Config(default_scheduler="volcano"), "volcano"),
    ("kai-scheduler", Config(), "kai-scheduler"),
], ids=["ours reset", "configurable default", "someone else's kept"])
def test_scheduler_name(scheduler, config, expected):
    out = mutation.mutate(workload("Job", spec={"schedulerName": scheduler}), BY_KEY["Job"], decision(), config)
    assert template_of(out)["spec"]["schedulerName"] == expected


def rich_job(kind: str = "Job") -> dict:
    """A Job (or another kind) with the user's own affinity, spread, env, labels and annotations
    everywhere we write."""
    return workload(kind, replicas=2, annotations={"team": "ml"}, labels={"app": "train"},
                    template_annotations={"sidecar.istio.io/inject": "false"},
                    containers=[container(env=[{"name": "NCCL_DEBUG", "value": "INFO"}]), container("log", gpus=0)],
                    spec={"affinity": {"nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                            {"matchExpressions": [USER_TERM]}]},
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {"weight": 1, "preference": {"matchExpressions": [USER_TERM]}}]}},
                        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                                       "whenUnsatisfiable": "ScheduleAnyway",
                                                       "labelSelector": {"matchLabels": {"app": "train"}}}]})


@pytest.mark.parametrize("name", list(DECISIONS))
@pytest.mark.parametrize("make", [lambda: workload("Job"), rich_job], ids=["bare job", "job with user settings"])
def test_applying_to_our_own_output_changes_nothing(make, name):
    once = mutation.mutate(make(), BY_KEY["Job"], DECISIONS[name], CONFIG, "ml/Job/train")
    assert mutation.mutate(once, BY_KEY["Job"], DECISIONS[name], CONFIG, "ml/Job/train") == once


@pytest.mark.parametrize("first", list(DECISIONS))
@pytest.mark.parametrize("second", list(DECISIONS))
def test_a_new_decision_replaces_ours_and_keeps_the_users(first, second):
    original = rich_job()
    again = mutation.mutate(mutation.mutate(original, BY_KEY["Job"], DECISIONS[first], CONFIG, "k"), BY_KEY["Job"],
                            DECISIONS[second], CONFIG, "k")
    assert again == mutation.mutate(original, BY_KEY["Job"], DECISIONS[second], CONFIG, "k")
    valid(again)


@pytest.mark.parametrize("name", list(DECISIONS))
@pytest.mark.parametrize("make", [lambda: workload("Job"), rich_job], ids=["bare job", "job with user settings"])
def test_without_injection_gives_back_what_the_user_wrote(make, name):
    original = make()
    placed = mutation.mutate(original, BY_KEY["Job"], DECISIONS[name], CONFIG, "k")
    assert mutation.without_injection(subject_of(placed)).obj == original


def test_the_input_is_never_changed():
    original = rich_job()
    kept = deep(original)
    mutation.mutate(original, BY_KEY["Job"], DECISIONS["distributed"], CONFIG, "k")
    mutation.without_injection(subject_of(original))
    assert original == kept


JOBSET = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "train", "namespace": "ml"},
          "spec": {"replicatedJobs": [{"name": name, "template": {"spec": {"template": template_of(rich_job())}}}
                                      for name in ("leader", "workers")]}}


@pytest.mark.parametrize("kind, make", [*((kind, lambda kind=kind: rich_job(kind)) for kind in API_VERSIONS),
                                        ("JobSet", lambda: deep(JOBSET))], ids=[*API_VERSIONS, "JobSet"])
def test_the_output_shares_only_what_no_writer_changes(kind, make):
    """The output is a copy where we write (templates, their metadata, spec, affinity, containers),
    so the writers after the mutation (a ProvisioningRequest's consumption) change it in place and
    leave the input as it was; what nobody writes (a container's resources) is the input's own."""
    original = make()
    kept = deep(original)
    out = mutation.mutate(original, BY_KEY[kind], DECISIONS["distributed"], CONFIG, f"ml/{kind}/train")
    provisioning.consumed_by(out, BY_KEY[kind], "pr-train", "queued-provisioning.gke.io")
    assert original == kept
    pairs = list(zip(pod_templates(BY_KEY[kind], original), pod_templates(BY_KEY[kind], out), strict=True))
    for before, after in pairs:
        assert after.template["metadata"]["annotations"][provisioning.CONSUME] == "pr-train"
        trainer = after.template["spec"]["containers"][0]
        assert {"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"} in trainer["env"]
        assert trainer["resources"] is before.template["spec"]["containers"][0]["resources"]


def test_templates_one_object_in_the_input_are_two_in_the_output():
    """YAML anchors make two replica specs hold one template object (`template: *worker`, as the
    CLI reads manifests): each gets its own copy, both placed, and the shared one stays as it was."""
    shared = template_of(rich_job())
    kept = deep(shared)
    jobset = {**deep(JOBSET), "spec": {"replicatedJobs": [{"name": name, "template": {"spec": {"template": shared}}}
                                                          for name in ("leader", "workers")]}}
    out = mutation.mutate(jobset, BY_KEY["JobSet"], DECISIONS["consolidated"], CONFIG, "ml/JobSet/train")
    first, second = (found.template for found in pod_templates(BY_KEY["JobSet"], out))
    assert first is not second and first == second
    assert first["metadata"]["annotations"][mutation.RESERVATION] == "ml/JobSet/train"
    assert shared == kept


def test_an_empty_template_metadata_in_the_output_is_its_own():
    """`metadata: {}` that nothing was written into is still the output's own (after a second
    reading): a writer after the mutation fills it, and the input, where an anchor made the same
    dict a volume's emptyDir too, stays as it was."""
    empty: dict = {}
    job = workload("Job", spec={"volumes": [{"name": "scratch", "emptyDir": empty}]})
    job["spec"]["template"]["metadata"] = empty
    kept = deep(job)
    out = mutation.mutate(job, BY_KEY["Job"], None, CONFIG)
    provisioning.consumed_by(out, BY_KEY["Job"], "pr-train", "queued-provisioning.gke.io")
    assert job == kept and empty == {}
    assert template_of(out)["metadata"]["annotations"][provisioning.CONSUME] == "pr-train"


def test_a_user_edit_of_our_variable_makes_it_theirs():
    placed = mutation.mutate(workload("Job"), BY_KEY["Job"], decision(), CONFIG)
    for item in template_of(placed)["spec"]["containers"][0]["env"]:
        if item["name"] == "NCCL_P2P_LEVEL":
            item["value"] = "SYS"
    again = mutation.mutate(placed, BY_KEY["Job"], DECISIONS["other leaf"], CONFIG)
    assert env_of(again, "trainer")["NCCL_P2P_LEVEL"] == "SYS"


def test_nothing_to_place_removes_ours_and_resets_the_scheduler():
    obj = workload("Job", spec={"schedulerName": "topology-aware-scheduler"})
    placed = mutation.mutate(obj, BY_KEY["Job"], decision(), CONFIG, "k")
    cleared = mutation.mutate(placed, BY_KEY["Job"], None, CONFIG)
    expected = deep(obj)
    expected["spec"]["template"]["spec"]["schedulerName"] = "default-scheduler"
    assert cleared == expected


@pytest.mark.parametrize("kind", ["Pod", "Job", "CronJob", "Deployment", "StatefulSet", "ReplicaSet"])
def test_every_kind_mutates_into_a_valid_object(kind):
    out = mutation.mutate(workload(kind), BY_KEY[kind], DECISIONS["distributed"], CONFIG, "k")
    valid(out)
    assert injection.already_placed(pod_template(BY_KEY[kind], out))


def test_already_placed_needs_our_affinity_still_there():
    placed = mutation.mutate(workload("Job"), BY_KEY["Job"], decision(), CONFIG, "k")
    assert injection.already_placed(pod_template(BY_KEY["Job"], placed))
    del template_of(placed)["spec"]["affinity"]
    assert not injection.already_placed(pod_template(BY_KEY["Job"], placed))
    assert not injection.already_placed(pod_template(BY_KEY["Job"], workload("Job")))


def test_an_unreadable_record_owns_nothing():
    obj = workload("Job", template_annotations={mutation.INJECTED: "{not json"},
                   containers=[container(env=[{"name": "NCCL_P2P_LEVEL", "value": "PIX"}])])
    out = mutation.mutate(obj, BY_KEY["Job"], decision(), CONFIG)
    assert env_of(out, "trainer")["NCCL_P2P_LEVEL"] == "PIX"
    assert mutation.Injection.loads("[1, 2]") == mutation.Injection()


def test_a_record_reads_back_and_is_written_as_earlier_versions_wrote_it():
    """Replicas of the version before write the record with json.dumps (sorted keys, no spaces):
    the same text from this one, so a rolling upgrade changes no record; and non-numbers, which
    nothing of ours writes, make a record unreadable rather than one that cannot be written back."""
    out = mutation.mutate(workload("Job"), BY_KEY["Job"], decision(), CONFIG, "ml/Job/train")
    record = annotations(out)[mutation.INJECTED]
    owned = mutation.Injection.loads(record)
    assert owned.required == ((PIN,),) and owned.dumps() == record
    assert record == json.dumps(json.loads(record), sort_keys=True, separators=(",", ":"))
    assert mutation.Injection.loads('{"label": "x", "preferred": {"weight": NaN}}') == mutation.Injection()


def required_of(obj: dict) -> list:
    return pod_template(BY_KEY["Job"], obj)["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]


def test_a_users_expression_identical_to_ours_in_another_term_stays_theirs():
    # Issue 14: the user's own PIN in term 2 was recorded as ours and removed on the next pass.
    terms = [{"matchExpressions": [USER_TERM]}, {"matchExpressions": [PIN]}]
    original = workload("Job", spec={"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}})
    placed = mutation.mutate(original, BY_KEY["Job"], decision(), CONFIG, "k")
    assert required_of(placed) == [{"matchExpressions": [USER_TERM, PIN]}, {"matchExpressions": [PIN]}]
    assert mutation.mutate(placed, BY_KEY["Job"], decision(), CONFIG, "k") == placed
    assert required_of(mutation.without_injection(subject_of(placed)).obj) == terms


def test_an_empty_term_matches_no_node_and_is_left_empty():
    terms = [{}, {"matchExpressions": [USER_TERM]}]
    original = workload("Job", spec={"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}})
    placed = mutation.mutate(original, BY_KEY["Job"], decision(), CONFIG, "k")
    assert required_of(placed) == [{}, {"matchExpressions": [USER_TERM, PIN]}]


def test_a_one_gpu_workload_gets_no_nccl_profile():
    one = decision(request(pods=1, gpus=1), interconnect=Interconnect.NVLINK)
    env = {e["name"]: e["value"] for e in pod_template(BY_KEY["Job"], mutation.mutate(
        workload("Job", gpus=1), BY_KEY["Job"], one, CONFIG, "k"))["spec"]["containers"][0]["env"]}
    assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_a_one_gpu_workload_is_not_described_as_crossing_nvlink():
    one = decision(request(pods=1, gpus=1), interconnect=Interconnect.NVLINK)
    text = mutation.summary(one)
    assert "nvlink" not in text.lower() and "GB/s" not in text
