"""Holds read from pods: an unbound pod carrying our placement holds its GPUs on every replica,
replaces its workload's hold instead of adding to it, and stops holding once bound or gone."""
from conftest import patched_object, review_of

from tests.fixtures.builders import gpu_job
from webhook import admission
from webhook.core.model import Outcome, PlacementRequest, Strategy
from webhook.kube.demo import make_node
from webhook.objects import feed
from webhook.objects.feed import index_of
from webhook.placement.placer import place_and_reserve
from webhook.settings.config import Config
from webhook.state.index import ClusterIndex

NODES = [make_node(f"n{i}", {"topology.scheduler/leaf": f"l{i}"}, 8) for i in range(3)]


def admitted_pod(index: ClusterIndex, config: Config, name: str) -> dict:
    """A 1-pod 8-GPU Job admitted into `index`, and the pod its controller makes from the template."""
    job = patched_object(review := review_of(gpu_job(name, 1, 8, gpu_count="8", placement_strategy="consolidated")),
                         admission.review(review, index, config).review)
    template = job["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {**template["metadata"], "name": f"{name}-x1", "namespace": "ml", "uid": f"uid-{name}"},
            "spec": template["spec"], "status": {"phase": "Pending"}}


def whole_node(name: str) -> PlacementRequest:
    return PlacementRequest(f"Job ml/{name}", 1, 8, Strategy.CONSOLIDATED)


def test_pending_pods_replace_their_jobs_hold_and_survive_a_restart(clock):
    config = Config()
    index = index_of(config, NODES, [], clock)
    pod = admitted_pod(index, config, "a")
    held_node = next(iter(index.ledger.holds["ml/Job/a"].sets))
    clock.now += 5  # its controller makes the pod
    feed.upsert(index, pod, "Pod")
    assert index.stats().gpus_reserved == 8, "the Job's pod replaces the Job's hold, it does not add to it"

    restarted = index_of(config, NODES, [pod], clock)  # a replica that never saw the Job
    assert restarted.stats().gpus_reserved == 8 and restarted.ledger.holds == {}
    taken = {place_and_reserve(restarted, whole_node(n), f"ml/Job/{n}").nodes for n in ("b", "c")}
    assert (held_node,) not in taken, "the pending pod's node is not given again"
    assert place_and_reserve(restarted, whole_node("d"), "ml/Job/d").outcome is Outcome.WAIT

    clock.now += config.reservation_ttl_seconds - 4  # the Job's hold lapses; its pending pod still holds
    index.expire_reservations()
    assert index.stats().gpus_reserved == 8 and index.ledger.holds == {}
    clock.now += 5  # and a pod unbound for a hold's whole time holds no more (issue 59 item 5)
    index.expire_reservations()
    assert index.stats().gpus_reserved == 0

    bound = {**pod, "spec": {**pod["spec"], "nodeName": held_node}, "status": {"phase": "Running"}}
    for view in (index, restarted):
        feed.upsert(view, bound, "Pod")
    assert index.stats().gpus_reserved == 0 and index.stats().gpus_used == 8
    assert restarted.stats().gpus_used == 8 and restarted.stats().gpus_reserved == 16  # b and c


def test_a_pending_pod_deleted_or_of_another_namespace_holds_nothing(clock):
    config = Config()
    index = index_of(config, NODES, [], clock)
    pod = admitted_pod(index_of(config, NODES, [], clock), config, "a")
    forged = {**pod, "metadata": {**pod["metadata"], "namespace": "attacker", "uid": "uid-forged"}}
    feed.upsert(index, forged, "Pod")
    assert index.stats().gpus_reserved == 0
    feed.upsert(index, pod, "Pod")
    assert index.stats().gpus_reserved == 8
    feed.delete(index, pod, "Pod")
    assert index.stats().gpus_reserved == 0


def test_a_pod_pinned_to_a_domain_of_several_nodes_names_no_node(clock):
    config = Config()
    pod = admitted_pod(index_of(config, NODES, [], clock), config, "a")
    pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] = {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "topology.scheduler/leaf", "operator": "In",
                                                     "values": ["l1"]}]}]}
    pod["spec"]["affinity"]["nodeAffinity"].pop("preferredDuringSchedulingIgnoredDuringExecution", None)
    assert index_of(config, NODES, [pod], clock).stats().gpus_reserved == 0
