"""The placement core against the rules users expect (the README of the seed project,
https://github.com/nod-ai/topology-aware-scheduler) and the issue's must-holds.

Cluster used by most cases (2 spines x 4 leaves x 4 nodes x 8 H100, one NVSwitch domain each):

    zone-a
    ├── spine-1: leaf-1 leaf-2 leaf-3 leaf-4   (4 nodes each: gpu-s1-l1-n1 ... n4)
    └── spine-2: leaf-5 leaf-6 leaf-7 leaf-8
"""
import dataclasses

import pytest

from webhook.core.model import (EXCEEDS_CLUSTER, EXCEEDS_NODES, NO_MATCHING_NODES, NO_ROOM_NOW, UNKNOWN_DOMAIN,
                                Interconnect, NodeRequirement, Outcome, PlacementRequest, Strategy)
from webhook.kube.demo import leaf_spine_nodes, make_node, make_pod
from webhook.objects import feed
from webhook.objects.feed import index_of
from webhook.placement.placer import place, place_and_reserve
from webhook.settings.config import Config
from webhook.state.index import ClusterIndex, NodeGone


def request(pods, gpus=8, strategy=Strategy.CONSOLIDATED, **kw):
    return PlacementRequest(f"Job test/{pods}x{gpus}", pods, gpus, strategy, **kw)


@pytest.fixture
def cluster(clock):
    return index_of(Config(), leaf_spine_nodes(), [], clock)


def leaves_of(index, decision):
    return sorted({index.nodes[n].labels["topology.scheduler/leaf"] for n in decision.nodes})


def spines_of(index, decision):
    return sorted({index.nodes[n].labels["topology.scheduler/spine"] for n in decision.nodes})


@pytest.mark.parametrize("nodes, leaves, spines", [
    pytest.param(2, 1, 1, id="2 nodes land in one leaf"),
    pytest.param(3, 1, 1, id="3 nodes land in one leaf"),
    pytest.param(4, 1, 1, id="4 nodes take one whole leaf"),
    pytest.param(8, 2, 1, id="8 nodes take two leaves of one spine"),
    pytest.param(16, 4, 1, id="16 nodes take the four leaves of one spine"),
])
def test_leaf_spine_rules(cluster, nodes, leaves, spines):
    decision = place(cluster, request(nodes))
    assert decision.outcome is Outcome.PLACED
    assert len(decision.nodes) == nodes  # one 8-GPU pod per node
    assert len(leaves_of(cluster, decision)) == leaves
    assert len(spines_of(cluster, decision)) == spines


def test_eight_nodes_pin_the_two_leaves_and_say_why(cluster):
    decision = place(cluster, request(8))
    pins = {r.key: r.values for r in decision.requirements}
    assert pins["topology.scheduler/spine"] == ("spine-1",)
    assert pins["topology.scheduler/leaf"] == ("leaf-1", "leaf-2")
    assert decision.interconnect is Interconnect.SPINE
    assert "no single leaf holds them" in decision.reasons[0]


def test_a_small_job_opens_a_node_where_small_jobs_run_not_in_the_gap_of_a_big_one(cluster):
    for n in (1, 2, 3):  # a 3-node job holds leaf-1 but its last node
        feed.upsert(cluster, make_pod(f"big-{n}", f"gpu-s1-l1-n{n}", 8), "Pod")
    feed.upsert(cluster, make_pod("small", "gpu-s2-l5-n1", 7), "Pod")  # small jobs run in leaf-5
    decision = place(cluster, request(1, gpus=2))
    # Every node with room is idle; leaf-1's idle node is the fullest domain's, but a job there
    # would keep leaf-1 from being whole again when the big job ends.
    assert decision.nodes[0].startswith("gpu-s2-l5-")


def test_a_multi_node_job_keeps_apart_from_where_small_jobs_run(cluster):
    feed.upsert(cluster, make_pod("small-1", "gpu-s1-l1-n1", 7), "Pod")
    feed.upsert(cluster, make_pod("small-2", "gpu-s1-l1-n2", 7), "Pod")
    feed.upsert(cluster, make_pod("small-3", "gpu-s1-l2-n1", 4), "Pod")
    feed.upsert(cluster, make_pod("big", "gpu-s1-l2-n2", 8), "Pod")
    for leaf in range(3, 9):  # only leaf-1 and leaf-2 are left with exactly two whole nodes
        feed.upsert(cluster, make_pod(f"big-{leaf}", f"gpu-s{1 if leaf <= 4 else 2}-l{leaf}-n1", 8), "Pod")
        feed.upsert(cluster, make_pod(f"other-{leaf}", f"gpu-s{1 if leaf <= 4 else 2}-l{leaf}-n2", 8), "Pod")
        feed.upsert(cluster, make_pod(f"third-{leaf}", f"gpu-s{1 if leaf <= 4 else 2}-l{leaf}-n3", 8), "Pod")
    # leaf-1 has fewer free GPUs (18 against 20) but two nodes where small jobs run; leaf-2 one.
    assert leaves_of(cluster, place(cluster, request(2))) == ["leaf-2"]


def test_second_two_node_job_reuses_the_half_used_leaf(cluster):
    first = place_and_reserve(cluster, request(2), "ns/Job/a")
    second = place_and_reserve(cluster, request(2), "ns/Job/b")
    assert leaves_of(cluster, first) == leaves_of(cluster, second) == ["leaf-1"]
    assert not set(first.nodes) & set(second.nodes)


def test_preferred_full_leaf_falls_back_to_nearest_leaf_and_says_so(cluster):
    for i in range(1, 5):
        feed.upsert(cluster, make_pod(f"busy-{i}", f"gpu-s2-l6-n{i}", 8), "Pod")
    decision = place(cluster, request(2, preferred_domain="leaf-6"))
    assert decision.preferred_honoured is False
    assert spines_of(cluster, decision) == ["spine-2"]  # a sibling leaf, not another spine
    assert leaves_of(cluster, decision) != ["leaf-6"]
    assert "preferred leaf leaf-6 cannot hold" in decision.reasons[0]


def test_preferred_domain_honoured_and_level_qualified(cluster):
    decision = place(cluster, request(2, preferred_domain="leaf=leaf-7"))
    assert decision.preferred_honoured is True and leaves_of(cluster, decision) == ["leaf-7"]


def test_a_domain_searched_first_takes_what_it_holds_silently_and_spills_to_its_nearest_neighbours(cluster):
    leaf_6 = next(path for path in cluster.tree.levels[2] if path[-1][1] == "leaf-6")
    unsteered = place(cluster, request(1, gpus=2))
    steered = place(cluster, request(1, gpus=2, search_first=leaf_6))
    assert leaves_of(cluster, unsteered) != ["leaf-6"] and leaves_of(cluster, steered) == ["leaf-6"]
    assert steered.preferred_honoured is None and len(steered.reasons) == len(unsteered.reasons)
    assert not any("prefer" in reason for reason in steered.reasons), "nobody asked for it: no reason says it"
    for i in range(1, 5):
        feed.upsert(cluster, make_pod(f"busy-{i}", f"gpu-s2-l6-n{i}", 8), "Pod")
    spilled = place(cluster, request(2, search_first=leaf_6))
    assert spines_of(cluster, spilled) == ["spine-2"] and leaves_of(cluster, spilled) != ["leaf-6"], \
        "a full domain searched first gives way to a sibling, nearest by topology"
    assert place(cluster, request(2, search_first=leaf_6, preferred_domain="leaf-7")).preferred_honoured is True


def test_a_domain_searched_first_changes_neither_a_distributed_spread_nor_where_a_wait_is_pinned(cluster):
    leaf_6 = next(path for path in cluster.tree.levels[2] if path[-1][1] == "leaf-6")
    def unsteered(decision):
        return dataclasses.replace(decision, request=dataclasses.replace(decision.request, search_first=None))
    spread = place(cluster, request(4, gpus=1, strategy=Strategy.DISTRIBUTED))
    assert unsteered(place(cluster, request(4, gpus=1, strategy=Strategy.DISTRIBUTED, search_first=leaf_6))) == spread
    for node in list(cluster.nodes):
        feed.upsert(cluster, make_pod(f"busy-{node}", node, 8), "Pod")
    waiting = place(cluster, request(2))
    assert waiting.outcome is Outcome.WAIT
    assert unsteered(place(cluster, request(2, search_first=leaf_6))) == waiting


def test_unknown_preferred_domain_is_never_and_lists_what_exists(cluster):
    decision = place(cluster, request(2, preferred_domain="leaf-99"))
    assert (decision.outcome, decision.code) == (Outcome.NEVER, UNKNOWN_DOMAIN)
    assert "leaf-99" in decision.reasons[0] and "leaf-1" in decision.reasons[0]
    assert "leaf: leaf-1, leaf-2, leaf-3, leaf-4, leaf-5, leaf-6, leaf-7, leaf-8)" in decision.reasons[0]  # all of them


def test_a_long_list_of_allowed_domains_says_how_many_it_leaves_out():
    nodes = [make_node(f"n{i}", {"topology.scheduler/leaf": f"rack-{i:02d}"}) for i in range(20)]
    decision = place(index_of(Config(), nodes), request(1, preferred_domain="rack-99"))
    assert "rack-00, rack-01," in decision.reasons[0] and "rack-11, ... and 8 more" in decision.reasons[0]


def test_per_pod_accounting_two_single_gpu_holes_do_not_hold_a_two_gpu_pod():
    nodes = [make_node(f"n{i}", {"topology.scheduler/leaf": "rack"}, gpus=8) for i in range(2)]
    pods = [make_pod(f"p{i}", f"n{i}", 7) for i in range(2)]
    index = index_of(Config(), nodes, pods)
    decision = place(index, request(1, gpus=2))
    assert decision.outcome is Outcome.WAIT and decision.code == NO_ROOM_NOW


def test_more_than_the_cluster_waits_for_nodes_unpinned_and_says_what_fits_where(cluster):
    decision = place(cluster, request(33))
    assert (decision.outcome, decision.code) == (Outcome.WAIT, EXCEEDS_NODES)
    assert decision.requirements == () and decision.scope is None  # nodes added later may take it
    assert "hold 32 such pod(s) (largest node: 8 GPUs); it waits for nodes to be added" in decision.reasons[0]
    assert "leaf: leaf-1 4 of 33 pods fit when idle, leaf-2 4 of 33 pods fit when idle" in " ".join(decision.reasons)


def test_refuse_unplaceable_restores_the_refusal(clock):
    index = index_of(Config(refuse_unplaceable=True), leaf_spine_nodes(), [], clock)
    decision = place(index, request(33))
    assert (decision.outcome, decision.code) == (Outcome.NEVER, EXCEEDS_CLUSTER)
    assert "32" in decision.reasons[0]
    only_tainted = index_of(Config(refuse_unplaceable=True), [make_node("t", {}, taints=[
        {"key": "dedicated", "value": "infer", "effect": "NoSchedule"}])])
    assert place(only_tainted, request(1)).outcome is Outcome.NEVER


def test_a_pod_larger_than_every_node_is_never_whatever_the_setting(cluster):
    decision = place(cluster, request(1, gpus=16))
    assert (decision.outcome, decision.code) == (Outcome.NEVER, EXCEEDS_CLUSTER)
    assert "no node it may use takes a pod of 16 GPU(s)" in decision.reasons[0]
    # Even when no node is open to it by its labels: no node of the cluster is that large.
    decision = place(cluster, request(1, gpus=16, node_selector={"pool": "none"}))
    assert (decision.outcome, decision.code) == (Outcome.NEVER, NO_MATCHING_NODES)


def test_nothing_fits_now_names_the_domain_that_fits_first(cluster):
    for node in list(cluster.nodes.values()):
        keep_free = 1 if node.labels["topology.scheduler/leaf"] == "leaf-3" else 0
        feed.upsert(cluster, make_pod(f"busy-{node.name}", node.name, 8 - keep_free), "Pod")
    decision = place(cluster, request(1, gpus=2))
    assert decision.outcome is Outcome.WAIT
    assert decision.scope.level_name == "node"
    decision = place(cluster, request(4))
    assert decision.outcome is Outcome.WAIT and "leaf leaf-3 will fit first" in decision.reasons[0]
    assert any(line.startswith("leaf: ") and "of 4 pods fit" in line for line in decision.reasons)
    # Leaves of one spine cost the same by the default preset's cost model: it waits in the spine.
    assert decision.scope.level_name == "spine" and decision.scope.name == "spine-1"


def test_single_pod_gets_smallest_nvlink_domain_best_fit():
    node = make_node("pcie-box", {}, gpus=8, product="NVIDIA-H100-PCIe",
                     annotations={"topology.scheduler/nvlink-domains": "0-3,4-7"})
    index = index_of(Config(), [node], [make_pod("a", "pcie-box", 3)])
    decision = place(index, request(1, gpus=4))
    assert decision.gpu_ids == (4, 5, 6, 7)  # the untouched island, not 3 + 1 across PCIe
    assert decision.interconnect is Interconnect.NVLINK
    decision = place(index, request(1, gpus=1))
    assert decision.gpu_ids == (3,)  # best fit: the island with one GPU left


def test_pod_wider_than_any_nvlink_domain_crosses_pcie():
    node = make_node("islands", {}, gpus=8, product="NVIDIA-A100-PCIE-40GB",
                     annotations={"topology.scheduler/nvlink-domains": "0-3,4-7"})
    decision = place(index_of(Config(), [node]), request(1, gpus=8))
    assert decision.interconnect is Interconnect.PCIE
    assert decision.bus_bandwidth_gbs == pytest.approx(25.0)


def test_distributed_spreads_one_pod_per_node_across_leaves(cluster):
    decision = place(cluster, request(4, strategy=Strategy.DISTRIBUTED))
    assert len(set(decision.nodes)) == 4
    assert len(leaves_of(cluster, decision)) == 4
    assert decision.spread_keys == ("kubernetes.io/hostname", "topology.scheduler/leaf")
    assert decision.requirements == ()


def test_distributed_latency_sensitive_stays_in_one_spine(cluster):
    decision = place(cluster, request(6, strategy=Strategy.DISTRIBUTED, latency_sensitive=True,
                                     preferred_domain="spine-2"))
    assert spines_of(cluster, decision) == ["spine-2"]
    assert len(leaves_of(cluster, decision)) == 4
    assert {r.key: r.values for r in decision.requirements}["topology.scheduler/spine"] == ("spine-2",)


def test_cordoned_and_notready_nodes_hold_nothing_now_but_make_a_wait_not_a_denial():
    nodes = [make_node("cordoned", {}, unschedulable=True), make_node("down", {}, ready=False),
             make_node("tainted", {}, taints=[{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}])]
    index = index_of(Config(), nodes)
    decision = place(index, request(1))
    assert (decision.outcome, decision.code) == (Outcome.WAIT, NO_ROOM_NOW)
    assert "2 GPU node(s) out of service for now may return: cordoned (cordoned), down (NotReady)" in decision.reasons
    tolerant = request(1, tolerations=({"key": "dedicated", "operator": "Exists"},))
    assert place(index, tolerant).nodes == ("tainted",)
    only_tainted = index_of(Config(), nodes[2:])
    decision = place(only_tainted, request(1))  # a node it tolerates may be added: it waits
    assert (decision.outcome, decision.code) == (Outcome.WAIT, NO_MATCHING_NODES)
    assert "untolerated taint: 1" in decision.reasons[0]


def test_a_drained_node_makes_a_job_wait_and_uncordoning_places_it_there():
    nodes = [make_node("a", {"topology.scheduler/leaf": "l1"}),
             make_node("b", {"topology.scheduler/leaf": "l1"}, unschedulable=True)]
    index = index_of(Config(), nodes)
    decision = place(index, request(2))
    assert (decision.outcome, decision.code) == (Outcome.WAIT, NO_ROOM_NOW)
    assert any("b (cordoned)" in reason for reason in decision.reasons)
    unreachable = make_node("b", {"topology.scheduler/leaf": "l1"},
                            taints=[{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}])
    feed.upsert(index, unreachable, "Node")
    assert place(index, request(2)).outcome is Outcome.WAIT
    feed.upsert(index, make_node("b", {"topology.scheduler/leaf": "l1"}), "Node")  # uncordoned and reachable
    decision = place(index, request(2))
    assert decision.outcome is Outcome.PLACED and sorted(decision.nodes) == ["a", "b"]


def test_a_node_whose_pods_are_terminating_is_the_wait_target():
    nodes = [make_node(name, {"topology.scheduler/leaf": "l1"}) for name in ("busy", "ending")]
    ending = make_pod("old-train", "ending", 8)
    ending["metadata"]["deletionTimestamp"] = "2026-11-24T04:00:00Z"
    index = index_of(Config(), nodes, [make_pod("serve", "busy", 8), make_pod("old-train", "ending", 8)])
    assert place(index, request(1)).nodes == () and place(index, request(1)).scope.name == "busy"  # by name
    feed.upsert(index, ending, "Pod")  # the same pod, now being deleted
    decision = place(index, request(1))
    assert decision.outcome is Outcome.WAIT and decision.scope.name == "ending"
    assert "8 GPU(s) there being freed by terminating pods" in decision.reasons[0]
    feed.delete(index, ending, "Pod")
    assert place(index, request(1)).nodes == ("ending",)


def test_pods_that_a_terminating_pods_node_will_hold_wait_pinned_to_that_node_alone():
    """KAI pipelines a job onto GPUs being released. Two pods of 4 GPUs: node `ending` holds both
    once its terminating pod is gone, so nothing is expected sooner anywhere wider; pinning the
    wait to the rack of two nodes would only let the pods split across them."""
    nodes = [make_node(name, {"topology.scheduler/leaf": "l1"}) for name in ("busy", "ending")]
    ending = make_pod("old-train", "ending", 8)
    ending["metadata"]["deletionTimestamp"] = "2026-11-24T04:00:00Z"
    index = index_of(Config(), nodes, [make_pod("serve", "busy", 8), ending])
    decision = place(index, request(2, gpus=4))
    assert decision.outcome is Outcome.WAIT and decision.locality_pays and decision.scope.name == "ending"
    assert NodeRequirement("kubernetes.io/hostname", ("ending",)) in decision.requirements
    assert any("expected to take 0.00 run times, in leaf l1 0.00" in r and "does not pay" in r
               for r in decision.reasons), decision.reasons


def test_node_selector_affinity_and_bandwidth_filter_before_counting(cluster):
    feed.upsert(cluster, make_node("fast", {"topology.scheduler/leaf": "leaf-9",
                                           "topology.scheduler/network-bandwidth": "800Gb"}), "Node")
    assert place(cluster, request(1, min_bandwidth_gbps=800)).nodes == ("fast",)
    terms = ({"matchExpressions": [{"key": "topology.scheduler/leaf", "operator": "In", "values": ["leaf-8"]}]},)
    assert leaves_of(cluster, place(cluster, request(2, required_node_terms=terms))) == ["leaf-8"]
    assert place(cluster, request(1, node_selector={"topology.scheduler/spine": "spine-2"})).nodes[0].startswith("gpu-s2")


def test_nodes_missing_a_level_label_are_alone_at_that_level():
    nodes = [make_node(f"bare-{i}", {"topology.kubernetes.io/zone": "z"}) for i in range(2)]
    index = index_of(Config(), nodes)
    decision = place(index, request(2))
    # Two unlabelled nodes share no leaf or spine: the job spans the zone, and says so.
    assert decision.outcome is Outcome.PLACED and decision.scope.level_name == "zone"
    assert decision.interconnect is Interconnect.ZONE


def test_reservations_confirm_expire_and_never_double_book(cluster, clock):
    decision = place_and_reserve(cluster, request(4), "ns/Job/a")
    assert cluster.stats().gpus_reserved == 32
    clock.now += 1
    other = place_and_reserve(cluster, request(4), "ns/Job/b")
    assert not set(decision.nodes) & set(other.nodes)
    pod = make_pod("a-0", decision.nodes[0], 8, "ns", annotations={"topology.scheduler/reservation": "ns/Job/a"})
    feed.upsert(cluster, pod, "Pod")
    feed.upsert(cluster, pod, "Pod")  # status updates do not confirm twice
    assert cluster.stats().gpus_reserved == 56 and cluster.stats().gpus_used == 8
    clock.now += Config().reservation_ttl_seconds
    cluster.expire_reservations()
    assert cluster.stats().gpus_reserved == 0 and cluster.stats().gpus_used == 8


def test_deleting_a_pending_pod_ends_its_own_reservation_but_not_its_owners(cluster):
    place_and_reserve(cluster, request(1), "ml/Pod/solo")
    place_and_reserve(cluster, request(2), "ml/Job/train")
    assert cluster.stats().gpus_reserved == 24
    feed.upsert(cluster, make_pod("train-0", None, 8, "ml", annotations={"topology.scheduler/reservation": "ml/Job/train"}), "Pod")
    feed.delete(cluster, make_pod("train-0", None, 8, "ml", annotations={"topology.scheduler/reservation": "ml/Job/train"}), "Pod")
    assert set(cluster.ledger.holds) == {"ml/Pod/solo", "ml/Job/train"}  # the Job makes another pod
    feed.delete(cluster, make_pod("solo", None, 8, "ml", annotations={"topology.scheduler/reservation": "ml/Pod/solo"}), "Pod")
    assert set(cluster.ledger.holds) == {"ml/Job/train"} and cluster.stats().gpus_reserved == 16


def test_replacing_the_same_workload_does_not_count_it_twice(cluster):
    first = place_and_reserve(cluster, request(4), "ns/Job/a")
    again = place_and_reserve(cluster, request(4), "ns/Job/a")
    assert first.nodes == again.nodes and cluster.stats().gpus_reserved == 32


def test_a_renewed_reservation_lasts_from_its_renewal(cluster, clock):
    ttl = Config().reservation_ttl_seconds
    place_and_reserve(cluster, request(1), "ns/Job/a")
    clock.now += ttl / 2
    place_and_reserve(cluster, request(1), "ns/Job/a")  # reinvoked or retried
    clock.now += ttl / 2 + 1
    cluster.expire_reservations()
    assert set(cluster.ledger.holds) == {"ns/Job/a"}
    clock.now += ttl / 2
    cluster.expire_reservations()
    assert cluster.ledger.holds == {} and cluster.stats().gpus_reserved == 0


def test_dry_run_reserves_nothing(cluster):
    place_and_reserve(cluster, request(4), None)
    assert cluster.stats().gpus_reserved == 0


def test_incremental_updates_match_a_rebuild(cluster):
    feed.upsert(cluster, make_pod("p", "gpu-s1-l1-n1", 4), "Pod")
    feed.upsert(cluster, make_node("gpu-s1-l1-n2", {"topology.kubernetes.io/zone": "zone-a",
                                                   "topology.scheduler/spine": "spine-2",
                                                   "topology.scheduler/leaf": "leaf-5"}), "Node")  # relabelled
    cluster.apply(NodeGone("gpu-s1-l1-n3"))
    feed.upsert(cluster, {**make_pod("p", "gpu-s1-l1-n1", 4), "status": {"phase": "Succeeded"}}, "Pod")
    rebuilt = ClusterIndex(Config())
    for name, node in cluster.nodes.items():
        feed.upsert(rebuilt, make_node(name, dict(node.labels)), "Node")
    a, b = cluster.root, rebuilt.root
    aggregates = lambda d: (d.pods_now, d.pods_idle, d.free_hist, d.free_gpus, d.partly_used)  # noqa: E731
    assert aggregates(a) == aggregates(b)
    assert set(cluster.levels[2]) == set(rebuilt.levels[2])


def test_deterministic(cluster):
    assert place(cluster, request(5)) == place(cluster, request(5))


def test_constraints_that_admit_every_node_take_the_fast_path(cluster):
    everywhere = ({"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a"]}]},)
    filters = cluster.filters
    assert filters.filters_nothing(request(2, required_node_terms=everywhere, min_bandwidth_gbps=200), cluster.nodes)
    assert not filters.filters_nothing(request(2, min_bandwidth_gbps=800), cluster.nodes)


def test_constrained_views_stay_exact_through_pod_events_and_reservations(cluster):
    pinned = ({"matchExpressions": [{"key": "topology.scheduler/leaf", "operator": "In", "values": ["leaf-2"]}]},)
    constrained = request(2, required_node_terms=pinned)
    assert leaves_of(cluster, place(cluster, constrained)) == ["leaf-2"]
    place_and_reserve(cluster, request(2, required_node_terms=pinned), "ns/Job/a")
    feed.upsert(cluster, make_pod("x", "gpu-s1-l2-n3", 8), "Pod")
    decision = place(cluster, constrained)  # leaf-2 has one free node left: it must wait
    assert decision.outcome is Outcome.WAIT
    cluster.release("ns/Job/a")
    assert place(cluster, constrained).outcome is Outcome.PLACED


def test_product_table_fallback_without_published_domains():
    sxm = make_node("sxm", {}, product="NVIDIA-A100-SXM4-80GB")
    pcie = make_node("pcie", {}, gpus=2, product="NVIDIA-A100-PCIE-40GB")
    index = index_of(Config(), [sxm, pcie])
    assert index.nodes["sxm"].nvlink_domains == (tuple(range(8)),)  # one NVSwitch domain
    assert index.nodes["pcie"].nvlink_domains == ()  # no NVLink assumed
    decision = place(index, request(1, gpus=2, node_selector={"kubernetes.io/hostname": "pcie"}))
    assert decision.interconnect is Interconnect.PCIE


def test_nvl72_preset_treats_a_clique_as_one_nvlink_domain_across_nodes():
    from webhook.settings.presets import PRESETS
    config = Config(levels=PRESETS["nvl72"])
    nodes = [make_node(f"tray-{r}-{i}", {"topology.kubernetes.io/zone": "z", "topology.scheduler/spine": "s",
                                        "nvidia.com/gpu.clique": f"uuid.{r}"}, gpus=4, product="NVIDIA-GB200")
             for r in range(2) for i in range(18)]
    index = index_of(config, nodes)
    decision = place(index, request(16, gpus=4))
    assert decision.scope.level_name == "clique" and decision.interconnect is Interconnect.NVLINK
    assert len({index.nodes[n].labels["nvidia.com/gpu.clique"] for n in decision.nodes}) == 1
    decision = place(index, request(20, gpus=4))  # more trays than one rack: crosses the spine
    assert decision.interconnect is Interconnect.SPINE


def test_spanning_leaves_fills_the_roomiest_and_keeps_the_next_leaf_whole():
    """spine s: leaf a (6 free nodes), leaf b (5), leaf c (3); 8 whole-node pods.
    6 in a + 2 in c leaves b whole for the next job; 4 + 4 would break a and b."""
    nodes = [make_node(f"{leaf}{i}", {"topology.kubernetes.io/zone": "z", "topology.scheduler/spine": "s",
                                      "topology.scheduler/leaf": leaf})
             for leaf, count in (("a", 6), ("b", 5), ("c", 3)) for i in range(count)]
    index = index_of(Config(), nodes)
    decision = place(index, request(8))
    assert leaves_of(index, decision) == ["a", "c"]
    assert sum(1 for n in decision.nodes if n.startswith("a")) == 6


def test_split_over_nodes_is_balanced():
    """One leaf, nodes with 7, 4 and 4 free GPUs; 8 one-GPU pods need two nodes: 4 + 4, not 7 + 1."""
    nodes = [make_node(f"n{i}", {"topology.scheduler/leaf": "l"}) for i in range(3)]
    pods = [make_pod("a", "n0", 1), make_pod("b", "n1", 4), make_pod("c", "n2", 4)]
    decision = place(index_of(Config(), nodes, pods), request(8, gpus=1))
    assert sorted(a.pods for a in decision.assignment) == [4, 4]


@pytest.mark.parametrize("fill_nics, leaf, per_node", [(True, "w", [2, 2]), (False, "h", [1, 1, 1, 1])])
def test_pods_smaller_than_the_nics_take_whole_nodes_over_half_used_ones(fill_nics, leaf, per_node):
    """Leaf h: four nodes with 4 of 8 GPUs free; leaf w: three idle nodes. Four 4-GPU pods fit
    tightest in h, one per node, where each node's share of the job uses 4 of its 8 NICs and halves
    the whole ring's bandwidth; two per node in w use all 8. `fill_nics: false` fills the holes."""
    labels = {"topology.scheduler/spine": "s"}
    nodes = [make_node(f"{name}{i}", {**labels, "topology.scheduler/leaf": name}) for name, count in (("h", 4), ("w", 3))
             for i in range(count)]
    index = index_of(Config(fill_nics=fill_nics), nodes, [make_pod(f"p{i}", f"h{i}", 4) for i in range(4)])
    decision = place(index, request(4, gpus=4))
    assert decision.outcome is Outcome.PLACED and leaves_of(index, decision) == [leaf]
    assert sorted(a.pods for a in decision.assignment) == per_node
    # h100-sxm: 48 GB/s per NIC, NVLink inside a node (370) the lower bound with all 8
    assert decision.bus_bandwidth_gbs == (370.0 if fill_nics else 48.0 * 4)
    assert "4 pod(s) x 4 GPU(s) in" in decision.reasons[0]
    assert ("2 pods per node, filling its 8 NICs" in decision.reasons[1]) is fill_nics


def test_a_leaf_label_groups_nodes_even_without_zone_and_spine_labels():
    nodes = [make_node(f"n{i}", {"topology.scheduler/leaf": "rack-7"}) for i in range(2)]
    decision = place(index_of(Config(), nodes), request(2))
    assert decision.scope.name == "rack-7" and decision.interconnect is Interconnect.LEAF
    # The nodes without zone and spine labels, in rack-7: a rack-7 under a labelled spine is another leaf.
    assert [r.expression for r in decision.requirements] == [
        {"key": "topology.kubernetes.io/zone", "operator": "DoesNotExist"},
        {"key": "topology.scheduler/spine", "operator": "DoesNotExist"},
        {"key": "topology.scheduler/leaf", "operator": "In", "values": ["rack-7"]}]


def test_a_pin_into_an_unnamed_domain_excludes_the_same_leaf_name_under_a_labelled_spine():
    nodes = [make_node(f"n{i}", {"topology.scheduler/leaf": "rack-7"}) for i in range(2)]
    nodes += [make_node(f"m{i}", {"topology.scheduler/spine": "s1", "topology.scheduler/leaf": "rack-7"}, gpus=4)
              for i in range(2)]
    decision = place(index_of(Config(), nodes), request(2))
    assert set(decision.nodes) <= {"n0", "n1"}
    spine = next(r for r in decision.requirements if r.key == "topology.scheduler/spine")
    assert spine.expression == {"key": "topology.scheduler/spine", "operator": "DoesNotExist"}


def test_an_unchanged_node_update_changes_nothing_and_keeps_the_constrained_subsets(cluster):
    pinned = ({"matchExpressions": [{"key": "topology.scheduler/leaf", "operator": "In", "values": ["leaf-2"]}]},)
    subset = cluster.restricted_to(request(2, required_node_terms=pinned))
    node = cluster.nodes["gpu-s1-l2-n1"]
    feed.upsert(cluster, make_node("gpu-s1-l2-n1", dict(node.labels)), "Node")  # a kubelet status update
    assert cluster.nodes["gpu-s1-l2-n1"] is node
    assert cluster.restricted_to(request(2, required_node_terms=pinned)) is subset


def test_changed_nodes_move_in_and_out_of_constrained_subsets_which_stay_exact(cluster):
    pool_a = request(2, node_selector={"pool": "a"})
    moved = {name: dict(node.labels) for name, node in cluster.nodes.items() if "-l2-" in name}
    for name, labels in moved.items():
        feed.upsert(cluster, make_node(name, {**labels, "pool": "a"}), "Node")
    subset = cluster.restricted_to(pool_a)
    assert sorted(subset.nodes) == sorted(moved)
    feed.upsert(cluster, make_pod("busy", "gpu-s1-l2-n1", 8), "Pod")
    ending = make_pod("ending", "gpu-s1-l3-n1", 4)
    ending["metadata"]["deletionTimestamp"] = "2026-11-24T04:00:00Z"
    feed.upsert(cluster, ending, "Pod")
    feed.upsert(cluster, make_node("gpu-s1-l3-n1", {**dict(cluster.nodes["gpu-s1-l3-n1"].labels), "pool": "a"}), "Node")
    feed.upsert(cluster, make_node("gpu-s1-l2-n2", {**moved["gpu-s1-l2-n2"], "pool": "b"}), "Node")  # leaves pool a
    feed.upsert(cluster, {**make_node("gpu-s1-l2-n3", {**moved["gpu-s1-l2-n3"], "pool": "a"}),
                         "spec": {"unschedulable": True}}, "Node")  # cordoned: stays, with no capacity
    cluster.apply(NodeGone("gpu-s1-l2-n4"))
    assert cluster.restricted_to(pool_a) is subset  # kept, not rebuilt
    rebuilt = ClusterIndex(Config())
    for name, node in cluster.nodes.items():
        if node.labels.get("pool") == "a":
            feed.upsert(rebuilt, make_node(name, dict(node.labels)), "Node")
    feed.upsert(rebuilt, make_pod("busy", "gpu-s1-l2-n1", 8), "Pod")
    feed.upsert(rebuilt, ending, "Pod")
    feed.upsert(rebuilt, {**make_node("gpu-s1-l2-n3", dict(cluster.nodes["gpu-s1-l2-n3"].labels)),
                         "spec": {"unschedulable": True}}, "Node")
    aggregates = lambda d: (d.pods_now, d.pods_idle, d.free_hist, d.free_gpus, d.alloc_gpus, d.nodes, d.partly_used,  # noqa: E731
                            d.freeing)
    assert subset.root.freeing == 4
    assert sorted(subset.nodes) == sorted(rebuilt.nodes) == ["gpu-s1-l2-n1", "gpu-s1-l2-n3", "gpu-s1-l3-n1"]
    assert aggregates(subset.root) == aggregates(rebuilt.root)
    assert {p: aggregates(d) for p, d in subset.levels[2].items()} == {
        p: aggregates(d) for p, d in rebuilt.levels[2].items()}


def test_a_node_pin_uses_the_hostname_label_where_kubelet_set_it_apart_from_the_name():
    node = make_node("ip-10-0-0-7.ec2.internal", {"topology.scheduler/leaf": "l1"})
    node["metadata"]["labels"]["kubernetes.io/hostname"] = "ip-10-0-0-7"
    index = index_of(Config(), [node, make_node("other", {"topology.scheduler/leaf": "l1"})],
                                      [make_pod("busy", "other", 8)])
    decision = place(index, request(1))
    assert decision.nodes == ("ip-10-0-0-7.ec2.internal",)
    assert NodeRequirement("kubernetes.io/hostname", ("ip-10-0-0-7",)) in decision.requirements


def test_a_split_over_racks_of_two_spines_is_pinned_to_those_racks_not_the_whole_zone():
    # zone z: spine s1 (racks r1, r2), spine s2 (racks r3, r4); 2 free nodes per rack except r4.
    nodes, pods = [], []
    for spine, racks in (("s1", ("r1", "r2")), ("s2", ("r3", "r4"))):
        for rack in racks:
            for n in range(2):
                name = f"{rack}-n{n}"
                nodes.append(make_node(name, {"topology.kubernetes.io/zone": "z", "topology.scheduler/spine": spine,
                                              "topology.scheduler/leaf": rack}))
                if rack == "r4":
                    pods.append(make_pod(f"busy-{name}", name, 8))
    index = index_of(Config(), nodes, pods)
    decision = place(index, request(6))
    assert decision.outcome is Outcome.PLACED and decision.scope.level_name == "zone"
    assert NodeRequirement("topology.scheduler/leaf", ("r1", "r2", "r3")) in decision.requirements


def test_a_job_no_spine_holds_fills_the_fewest_racks_of_the_spines_it_takes_as_kueue_does():
    """Kueue's BestFit descent (findTopologyAssignment, phase 2b) pools the racks of every spine it
    took and fills the roomiest first, the last rack the tightest that holds the rest. Spine s1 has
    racks with 4, 2, 2 and 1 free nodes (9), s2 two racks of 4 (8); 13 whole-node pods hold in no
    spine. Filling s1 whole and then 4 in s2 would take 5 racks; 4 + 4 + 4 + the rack of 1 take 4."""
    free = {"s1": {"r1": 4, "r2": 2, "r3": 2, "r4": 1}, "s2": {"r5": 4, "r6": 4, "r7": 0, "r8": 0}}
    nodes, pods = [], []
    for spine, racks in free.items():
        for rack, idle in racks.items():
            for n in range(4):
                name = f"{rack}-n{n}"
                nodes.append(make_node(name, {"topology.kubernetes.io/zone": "z", "topology.scheduler/spine": spine,
                                              "topology.scheduler/leaf": rack}))
                if n >= idle:
                    pods.append(make_pod(f"busy-{name}", name, 8))
    index = index_of(Config(), nodes, pods)
    for strategy in (Strategy.CONSOLIDATED, Strategy.BALANCED):  # balanced: a peer's preferred level
        decision = place(index, request(13, strategy=strategy))
        assert decision.outcome is Outcome.PLACED and decision.scope.level_name == "zone"
        assert leaves_of(index, decision) == ["r1", "r4", "r5", "r6"]
        assert NodeRequirement("topology.scheduler/leaf", ("r1", "r4", "r5", "r6")) in decision.requirements


def test_best_fit_orders_follow_nodes_that_move_between_leaves_and_leaves_that_go(cluster):
    for g in (2, 8):
        cluster.tree.orders[2].best_fit(g, 1)  # sorted now: the reads below catch up on the changes
    leaf1 = [name for name, node in cluster.nodes.items() if node.labels["topology.scheduler/leaf"] == "leaf-1"]
    for name in leaf1[:-1]:
        cluster.apply(NodeGone(name))
    last = dict(cluster.nodes[leaf1[-1]].labels)
    feed.upsert(cluster, make_node(leaf1[-1], {**last, "topology.scheduler/leaf": "leaf-9"}), "Node")  # leaf-1 is gone
    feed.upsert(cluster, make_pod("half", leaf1[-1], 4), "Pod")
    for g in (2, 8):
        for pods in (1, 2, 4, 5):
            leaves = cluster.levels[2].values()
            scanned = min((d for d in leaves if d.fits_now(g) >= pods),
                          key=lambda d: (d.fits_now(g), d.partly_used, d.free_gpus, d.path), default=None)
            assert cluster.tree.orders[2].best_fit(g, pods) is scanned
    assert all(d.ref.name != "leaf-1" for d in cluster.levels[2].values())


def test_a_placed_job_is_confined_to_the_very_nodes_held_for_it_and_a_deployment_to_its_domain():
    """Pinned only to its domain, a Job's pods could be bound onto nodes of that domain held for
    another workload, which then finds no room where it is pinned (issue 59 item 9)."""
    from conftest import review_of

    from tests.fixtures.builders import workload
    from webhook.admission import review
    from webhook.cli import file_index
    from webhook.kube import demo

    index, _ = file_index(Config(), demo.demo_cluster())
    for kind, expect_nodes in (("Job", True), ("Deployment", False)):
        obj = workload(kind, name=f"train-{kind.lower()}", replicas=2,
                       template_annotations={"topology.scheduler/placement-strategy": "consolidated"})
        result = review(review_of(obj), index, Config())
        assert result.outcome == "placed"
        terms = result.admitted["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        named = [e["values"] for e in terms[0]["matchExpressions"] if e["key"] == "kubernetes.io/hostname"]
        held = sorted(a.node for a in result.decision.assignment)
        assert named == ([held] if expect_nodes else []), (kind, named, held)
