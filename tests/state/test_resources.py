"""Resources other than GPUs: counted as kube-scheduler's NodeResourcesFit counts them, as a fit
filter beside the GPUs that placement optimises."""
import pytest

from webhook.core.model import NO_MATCHING_NODES, NO_ROOM_NOW, Outcome, PlacementRequest, Strategy
from webhook.core.resources import pod_requests, quantity
from webhook.kube.demo import make_node, make_pod
from webhook.objects import feed
from webhook.objects.feed import index_of
from webhook.placement.placer import place
from webhook.settings.config import Config

GiB = 2**30


@pytest.mark.parametrize("text, resource, value", [
    ("500m", "cpu", 500), ("2", "cpu", 2000), ("0.1", "cpu", 100), ("64Gi", "memory", 64 * GiB),
    ("1.5G", "memory", 1_500_000_000), ("1e3", "memory", 1000), ("110", "pods", 110), ("1k", "rdma/hca", 1000),
    ("100m", "memory", 1),  # a fraction of a byte rounds up, as the API rounds
])
def test_quantities_in_base_units(text, resource, value):
    assert quantity(text, resource) == value


def test_a_pod_request_is_containers_and_sidecars_summed_or_the_largest_init_container_plus_overhead():
    spec = {
        "containers": [{"resources": {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"nvidia.com/gpu": "8"}}},
                       {"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}],  # limits only: requested at them
        "initContainers": [{"resources": {"requests": {"cpu": "8"}}},
                           {"restartPolicy": "Always", "resources": {"requests": {"memory": "2Gi"}}}],
        "overhead": {"cpu": "250m"},
    }
    assert pod_requests(spec) == {"cpu": 8250, "memory": 19 * GiB, "pods": 1}


def cpu_pod(name, node, gpus, cpu, namespace="default"):
    pod = make_pod(name, node, gpus, namespace)
    pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu}
    return pod


def request(pods, gpus, cpu, **kw):
    per_pod = tuple(sorted(pod_requests({"containers": [{"resources": {"requests": {"cpu": cpu}}}]}).items()))
    return PlacementRequest("Job ml/x", pods, gpus, Strategy.CONSOLIDATED, resources=per_pod, **kw)


def leaf_nodes(*names):
    return [make_node(name, {"topology.scheduler/leaf": "l1"}) for name in names]


def test_a_node_without_the_cpu_is_never_chosen_even_when_it_sorts_first():
    # "a" is the best GPU fit (4 free) but a CPU-hungry pod without GPUs left it 1 core.
    index = index_of(Config(), leaf_nodes("a", "b"),
                                      [make_pod("half", "a", 4), cpu_pod("etl", "a", 0, "95")])
    assert place(index, request(1, 4, "500m")).nodes == ("a",)  # still room for half a core
    decision = place(index, request(1, 4, "2000m"))
    assert decision.outcome is Outcome.PLACED and decision.nodes == ("b",)
    feed.delete(index, cpu_pod("etl", "a", 0, "95"), "Pod")  # the CPU comes back: the tighter node again
    assert place(index, request(1, 4, "2000m")).nodes == ("a",)


def test_a_node_at_its_pod_limit_is_never_chosen():
    full = make_node("full", {"topology.scheduler/leaf": "l1"})
    full["status"]["allocatable"]["pods"] = "2"
    index = index_of(Config(), [full, *leaf_nodes("other")],
                                      [cpu_pod("p1", "full", 0, "1"), cpu_pod("p2", "full", 0, "1"),
                                       make_pod("busy", "other", 4)])
    assert place(index, request(1, 4, "1")).nodes == ("other",)


def test_pods_sharing_a_node_are_counted_by_cpu_too():
    # 2 pods x 4 GPUs x 40 cores: one 8-GPU node with 96 cores holds only 2 of them... with 80
    # cores taken, none; with 50 taken, one.
    index = index_of(Config(), leaf_nodes("a", "b"), [cpu_pod("etl", "a", 0, "50")])
    decision = place(index, request(2, 4, "40"))
    assert decision.outcome is Outcome.PLACED
    assert {a.node: a.pods for a in decision.assignment} == {"b": 2}
    feed.upsert(index, cpu_pod("etl2", "b", 0, "50"), "Pod")
    decision = place(index, request(2, 4, "40"))
    assert {a.node: a.pods for a in decision.assignment} == {"a": 1, "b": 1}


def test_cpu_exhausted_now_waits_and_more_than_any_node_has_is_refused():
    index = index_of(Config(), leaf_nodes("a"), [cpu_pod("etl", "a", 0, "95")])
    decision = place(index, request(1, 8, "8"))
    assert (decision.outcome, decision.code) == (Outcome.WAIT, NO_ROOM_NOW)
    decision = place(index, request(1, 8, "200"))
    assert (decision.outcome, decision.code) == (Outcome.NEVER, NO_MATCHING_NODES)


def test_the_constrained_subset_stays_exact_as_pods_come_and_go():
    nodes = leaf_nodes("a", "b", "c")
    index = index_of(Config(), nodes, [cpu_pod("etl", "a", 0, "90")])
    wanted = request(1, 2, "8")
    subset = index.restricted_to(wanted)
    events = [cpu_pod("x", "b", 2, "30"), cpu_pod("y", "b", 0, "60"), cpu_pod("z", "c", 4, "1")]
    for pod in events:
        feed.upsert(index, pod, "Pod")
    feed.delete(index, cpu_pod("etl", "a", 0, "90"), "Pod")
    assert index.restricted_to(wanted) is subset
    rebuilt = index_of(Config(), nodes, events).restricted_to(wanted)
    assert {n: c.free for n, c in subset.nodes.items()} == {n: c.free for n, c in rebuilt.nodes.items()} == {
        "a": 8, "b": 0, "c": 4}  # b: 6 cores left, no room for an 8-core pod
    assert (subset.root.pods_now, subset.root.free_hist) == (rebuilt.root.pods_now, rebuilt.root.free_hist)


def test_a_workload_asks_for_its_pods_resources_beside_its_gpus():
    from tests.fixtures.builders import gpu_job, subject_of
    from webhook.objects import workload
    job = gpu_job("train", 2, 8)
    job["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "32", "memory": "256Gi"}
    wanted = workload.read(subject_of(job)).request
    assert dict(wanted.resources) == {"cpu": 32000, "memory": 256 * GiB, "pods": 1}
