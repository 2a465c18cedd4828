"""Reinvocation as a property: over generated workloads with arbitrary existing node affinity,
spread constraints and env, applying the webhook to its own output changes nothing, what we
added comes off exactly, and the nodes the pod may run on after mutation are a subset of the
nodes the user's own rules allow (evaluated with Kubernetes' semantics on the demo cluster)."""
import base64
import json
import uuid

import jsonpatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures.builders import subject_of
from tests.fixtures.shared import LABELS, allowed_nodes
from webhook import admission
from webhook.admission import make_review
from webhook.cli import file_index
from webhook.kube import demo
from webhook.objects import mutation
from webhook.settings.config import Config

CONFIG = Config()
NODES, PODS = demo.demo_cluster()
KEYS = sorted({"topology.kubernetes.io/zone", "topology.scheduler/spine", "topology.scheduler/leaf",
               "kubernetes.io/hostname", "example.com/absent"})
VALUES = sorted({v for labels in LABELS.values() for k, v in labels.items() if k in KEYS})


# ----- generated workloads ------------------------------------------------------------------------

expression = st.builds(
    lambda key, op, values: {"key": key, "operator": op, **({"values": values} if op in ("In", "NotIn") else {})},
    st.sampled_from(KEYS), st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]),
    st.lists(st.sampled_from(VALUES), min_size=1, max_size=3, unique=True))
term = st.one_of(st.just({}), st.builds(lambda e: {"matchExpressions": e}, st.lists(expression, min_size=1, max_size=3)))
spread = st.builds(lambda key, when: {"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": when,
                                      "labelSelector": {"matchLabels": {"app": "x"}}},
                   st.sampled_from(KEYS[:4]), st.sampled_from(["DoNotSchedule", "ScheduleAnyway"]))
env = st.lists(st.builds(lambda name, value: {"name": name, "value": value},
                         st.sampled_from(["NCCL_P2P_LEVEL", "CUDA_DEVICE_ORDER", "NCCL_IB_DISABLE", "OTHER"]),
                         st.sampled_from(["NVL", "SYS", "0", "PCI_BUS_ID"])),
               max_size=3, unique_by=lambda e: e["name"])


@st.composite
def workloads(draw) -> dict:
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    annotations = {"topology.scheduler/placement-strategy": draw(st.sampled_from(["consolidated", "distributed",
                                                                                  "balanced"]))}
    if draw(st.booleans()):
        annotations["topology.scheduler/latency-sensitive"] = "true"
    pod = demo.make_pod(draw(st.sampled_from(["a", "b"])), None, gpus, namespace="ml", annotations=annotations)
    del pod["status"], pod["metadata"]["uid"]
    spec = pod["spec"]
    node_affinity = {}
    terms = draw(st.lists(term, max_size=3))
    if terms:
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": terms}
    preferred = draw(st.lists(st.builds(lambda e: {"weight": 10, "preference": {"matchExpressions": e}},
                                        st.lists(expression, min_size=1, max_size=2)), max_size=2))
    if preferred:
        node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    if node_affinity:
        spec["affinity"] = {"nodeAffinity": node_affinity}
    constraints = draw(st.lists(spread, max_size=2, unique_by=lambda c: (c["topologyKey"], c["whenUnsatisfiable"])))
    if constraints:
        spec["topologySpreadConstraints"] = constraints
    variables = draw(env)
    if variables:
        spec["containers"][0]["env"] = variables
    # Init containers, classic or sidecars (restartPolicy Always), with GPUs or not: only the sidecars
    # asking GPUs get our env, and only the containers whose env changes are copied and patched.
    init = draw(st.lists(st.builds(_init_container, st.sampled_from(["setup", "side"]), st.sampled_from([0, 1]),
                                   st.booleans(), env), max_size=2, unique_by=lambda c: c["name"]))
    if init:
        spec["initContainers"] = init
    return pod


def _init_container(name: str, gpus: int, sidecar: bool, variables: list) -> dict:
    out: dict = {"name": name, "image": "busybox", **({"restartPolicy": "Always"} if sidecar else {})}
    if gpus:
        out["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    if variables:
        out["env"] = variables
    return out


def wire_patch(response: dict) -> list:
    """The JSON Patch as the apiserver reads it from the answer."""
    return json.loads(base64.b64decode(response["patch"])) if response.get("patch") else []


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_the_second_application_is_a_no_op_and_never_widens_where_the_pod_may_run(pod):
    index, _ = file_index(CONFIG, (NODES, PODS))
    first = admission.review(make_review(pod, uid=str(uuid.uuid4())), index, CONFIG)
    assert first.outcome != "failed-open", first.error
    response = first.review["response"]
    if not response["allowed"]:
        return
    mutated = jsonpatch.apply_patch(pod, wire_patch(response))
    assert allowed_nodes(mutated) <= allowed_nodes(pod)
    assert mutation.without_injection(subject_of(mutated)).obj == pod  # what we added comes off exactly
    second = admission.review(make_review(mutated, uid=str(uuid.uuid4())), index, CONFIG)
    assert second.review["response"]["allowed"] and wire_patch(second.review["response"]) == []
