"""Issue 26: a wait is pinned only where locality pays, and pinned waits are protected.

Cluster: 2 spines x 4 leaves x 4 nodes x 8 H100 (webhook.kube.demo.leaf_spine_nodes), every GPU
taken except where a test frees some. In the default preset crossing leaves inside a spine costs
nothing (spine oversubscription 1) and crossing spines does (zone oversubscription 4).
"""
import dataclasses
import math

import pytest

from webhook.core.injection import waited_domain
from webhook.objects.feed import index_of
from webhook.objects import feed
from webhook.state.index import ClusterIndex
from webhook.settings.config import Config
from webhook.settings.loading import levels_from
from webhook.settings.presets import HOSTNAME_LABEL
from webhook.core.injection import RESERVATION, WAITING_FOR, format_domain_path
from webhook.core.model import NO_ROOM_NOW, Outcome, PlacementRequest, Strategy
from webhook.placement import waiting
from webhook.placement.placer import place, place_and_reserve, place_gated
from webhook.kube.demo import leaf_spine_nodes, make_pod
from webhook.placement import enforce
from webhook.objects.workload import read

from tests.fixtures.builders import subject_of, workload

SPINE_1 = (("topology.kubernetes.io/zone", "zone-a"), ("topology.scheduler/spine", "spine-1"))
WAITER_KEY = "ml/Job/big"


def request(pods, gpus=8, strategy=Strategy.CONSOLIDATED, **kw):
    return PlacementRequest(f"Job test/{pods}x{gpus}", pods, gpus, strategy, **kw)


def busy_cluster(clock, free: dict[str, int], config=Config()) -> ClusterIndex:
    """Every node full but those in `free` (node name -> free GPUs)."""
    nodes = leaf_spine_nodes()
    pods = [make_pod(f"busy-{n['metadata']['name']}", n["metadata"]["name"], 8 - free.get(n["metadata"]["name"], 0))
            for n in nodes if free.get(n["metadata"]["name"], 0) < 8]
    return index_of(config, nodes, pods, clock)


def add_waiter(index: ClusterIndex, path=SPINE_1, pods=2, gpus=8, key=WAITER_KEY) -> list[dict]:
    """The pending pods of a pinned wait, as the mutation annotates them."""
    waiting = [make_pod(f"{key.rsplit('/', 1)[-1]}-{i}", None, gpus, "ml", phase="Pending",
                        annotations={WAITING_FOR: format_domain_path(path), RESERVATION: key}) for i in range(pods)]
    for pod in waiting:
        feed.upsert(index, pod, "Pod")
    return waiting


# -- waiting only where locality pays ---------------------------------------------------------

def test_a_one_pod_wait_only_prefers_the_node_that_frees_first(clock):
    index = busy_cluster(clock, {"gpu-s1-l2-n3": 4})
    decision = place(index, request(1))
    assert (decision.outcome, decision.code, decision.locality_pays) == (Outcome.WAIT, NO_ROOM_NOW, False)
    assert decision.scope.name == "gpu-s1-l2-n3"  # the node closest to fitting
    assert any("one pod runs alike on any node" in r for r in decision.reasons)
    assert not enforce.pins(decision, Config())  # written as a preference for that node
    assert waited_domain(enforce.enforced(decision, Config())) is None
    pinned = place(busy_cluster(clock, {"gpu-s1-l2-n3": 4}, Config(pin_only_where_locality_pays=False)), request(1))
    assert pinned.locality_pays and enforce.pins(pinned, Config()) and pinned.scope == decision.scope


def test_a_multi_pod_wait_is_pinned_as_wide_as_the_cost_model_allows(clock):
    decision = place(busy_cluster(clock, {"gpu-s1-l2-n3": 8}), request(2))
    assert decision.outcome is Outcome.WAIT and decision.locality_pays
    assert decision.scope.level_name == "spine"  # leaves of one spine cost the same; spines do not
    assert any("no less bandwidth anywhere in spine spine-1 than in leaf leaf-2" in r for r in decision.reasons)
    assert waited_domain(enforce.enforced(decision, Config())) == format_domain_path(SPINE_1)
    oversubscribed = Config(levels=tuple(dataclasses.replace(lv, oversubscription=2.0) if lv.name == "spine" else lv
                                         for lv in Config().levels), levels_auto=False)
    chatty = dataclasses.replace(oversubscribed, communication_share=1.0)
    at_leaf = place(busy_cluster(clock, {"gpu-s1-l2-n3": 8}, chatty), request(2))
    assert at_leaf.scope.level_name == "leaf" and at_leaf.scope.name == "leaf-2" and at_leaf.locality_pays


def test_a_wait_spills_a_level_wider_where_the_wait_it_saves_outweighs_the_slower_run(clock):
    """Leaf-2 holds 1 of 2 pods and 3 of its nodes are taken: the one more it needs frees after
    H(3) - H(2) = 1/3 run times; spine-1 has 15 taken, 1/15. Spanning leaves halves the bandwidth
    (spine oversubscription 2; an H100 node's NICs, 0.09 where NVLink caps the leaf's) and stretches
    a run by the communication share times that: 0.09 < 1/3 - 1/15, and the wait moves to the spine; spanning spines (x4 more) stretches it by 0.6: it stops there.
    A communication share of 1 keeps it in the leaf (previous test), one of 0 pins it nowhere."""
    spine_2x = Config(levels=tuple(dataclasses.replace(lv, oversubscription=2.0) if lv.name == "spine" else lv
                                   for lv in Config().levels), levels_auto=False)
    decision = place(busy_cluster(clock, {"gpu-s1-l2-n3": 8}, spine_2x), request(2))
    assert decision.outcome is Outcome.WAIT and decision.scope.level_name == "spine" and decision.locality_pays
    assert decision.scope.name == "spine-1"
    assert any("leaf leaf-2 is expected to take 0.33 run times, in spine spine-1 0.07, and spanning it "
               "stretches the run by at most 0.09 (communication share 0.1)" in r for r in decision.reasons)
    assert waited_domain(enforce.enforced(decision, spine_2x)) == format_domain_path(SPINE_1)
    kept = place(busy_cluster(clock, {"gpu-s1-l2-n3": 8}, spine_2x), request(2, max_domain="leaf"))
    assert kept.scope.name == "leaf-2" and kept.locality_pays  # never wider than max-domain
    silent = dataclasses.replace(spine_2x, communication_share=0.0)
    anywhere = place(busy_cluster(clock, {"gpu-s1-l2-n3": 8}, silent), request(2))
    assert anywhere.outcome is Outcome.WAIT and not anywhere.locality_pays and not enforce.pins(anywhere, silent)
    assert anywhere.scope.name == "leaf-2"  # still names where it fits first, as a preference


def test_expected_wait_counts_taken_places_terminating_ones_as_free(clock):
    index = busy_cluster(clock, {})
    leaf = next(d for d in index.tree.levels[2].values() if d.ref.name == "leaf-2")
    assert waiting.expected_wait(leaf, 8, 4) == pytest.approx(1 + 1 / 2 + 1 / 3 + 1 / 4)  # the last of 4
    assert waiting.expected_wait(leaf, 8, 1) == pytest.approx(1 / 4)  # the first of 4
    assert waiting.expected_wait(leaf, 8, 5) == math.inf  # 4 nodes never hold 5 pods of 8
    root = index.tree.root
    for pods in (15, 17, 31, 32):  # past 16 places (H(17), H(32)) the harmonic numbers come from their series
        assert waiting.expected_wait(root, 8, pods) == pytest.approx(
            sum(1 / k for k in range(33 - pods, 33)), abs=1e-9)
    ending = make_pod("busy-gpu-s1-l2-n3", "gpu-s1-l2-n3", 8)
    ending["metadata"]["deletionTimestamp"] = "2026-11-25T12:00:00Z"
    feed.upsert(index, ending, "Pod")  # terminating: its node counts as free
    assert waiting.expected_wait(leaf, 8, 1) == 0.0 and waiting.expected_wait(leaf, 8, 2) == pytest.approx(1 / 3)


def test_a_balanced_wait_is_pinned_where_waiting_pays_and_else_only_prefers(clock):
    """The default strategy weighs its wait as consolidated does: a preference on a multi-pod wait
    lets kube-scheduler scatter the pods over whatever frees first."""
    index = busy_cluster(clock, {"gpu-s1-l2-n3": 8})
    balanced = place(index, request(2, strategy=Strategy.BALANCED))
    consolidated = place(index, request(2))
    assert (balanced.scope, balanced.locality_pays) == (consolidated.scope, True)
    assert enforce.pins(balanced, Config()) and waited_domain(enforce.enforced(balanced, Config())) == format_domain_path(SPINE_1)
    one_pod = place(busy_cluster(clock, {"gpu-s1-l2-n3": 4}), request(1, strategy=Strategy.BALANCED))
    assert not one_pod.locality_pays and not enforce.pins(one_pod, Config())
    unweighed = Config(pin_only_where_locality_pays=False)
    before = place(busy_cluster(clock, {"gpu-s1-l2-n3": 8}, unweighed), request(2, strategy=Strategy.BALANCED))
    assert not enforce.pins(before, unweighed) and waited_domain(enforce.enforced(before, unweighed)) is None


def test_pods_that_fit_one_node_wait_wider_where_its_nics_are_all_they_would_share(clock):
    """2 pods x 4 GPUs fit node n3 once idle (4 free now), but ranks in different pods talk over
    the node's NICs, as they would across its leaf: waiting for the node alone only delays them.
    The wait widens to spine-1 (leaves cost nothing more there), not past it (the zone's x4
    oversubscription stretches a run by 0.3 for a wait 1/31 - 1/63 shorter); at a communication
    share of 0 it is not pinned at all."""
    index = busy_cluster(clock, {"gpu-s1-l2-n3": 4})
    decision = place(index, request(2, gpus=4))
    assert decision.outcome is Outcome.WAIT and decision.scope.name == "spine-1" and decision.locality_pays
    assert any("so spilling pays" in r and "so spilling does not pay: it waits in spine spine-1" in r
               for r in decision.reasons), decision.reasons
    silent = Config(communication_share=0.0)
    anywhere = place(busy_cluster(clock, {"gpu-s1-l2-n3": 4}, silent), request(2, gpus=4))
    assert not anywhere.locality_pays and not enforce.pins(anywhere, silent)


def test_a_wait_the_whole_cluster_names_says_so_and_is_not_pinned(clock):
    """Without topology levels (hostname only), a job no node holds waits for the whole cluster."""
    only_hosts = Config(levels=levels_from([HOSTNAME_LABEL]), levels_auto=False)
    decision = place(busy_cluster(clock, {"gpu-s1-l2-n3": 8}, only_hosts), request(2))
    assert decision.outcome is Outcome.WAIT and not decision.locality_pays and not enforce.pins(decision, only_hosts)
    assert all(r and not r.startswith(":") for r in decision.reasons)


@pytest.mark.parametrize("kind, annotations, may_pin", [
    ("Job", {}, True),
    ("Job", {"topology.scheduler/preferred-domain": "leaf-2"}, False),  # the user asked for a preference
    ("Job", {"kueue.x-k8s.io/podset-preferred-topology": "topology.scheduler/leaf"}, False),
    ("Deployment", {}, False),  # its template keeps what we write: a pin would outlive the wait
    ("CronJob", {}, False),
])
def test_a_balanced_wait_is_pinned_only_for_work_that_ends_and_no_preference_of_the_users(clock, kind, annotations,
                                                                                        may_pin):
    obj = workload(kind, replicas=2, annotations={"topology.scheduler/gpu-count": "16", **annotations})
    request_ = read(subject_of(obj)).request
    assert request_.strategy is Strategy.BALANCED and request_.may_pin_wait is may_pin
    assert read(subject_of(workload("Pod"))).request.may_pin_wait  # a pod's work ends
    decision = place(busy_cluster(clock, {"gpu-s1-l2-n3": 8}), dataclasses.replace(request_, preferred_domain=None))
    assert decision.outcome is Outcome.WAIT and enforce.pins(decision, Config()) is may_pin


def test_max_domain_keeps_a_one_pod_wait_pinned(clock):
    decision = place(busy_cluster(clock, {"gpu-s1-l2-n3": 4}), request(1, max_domain="leaf"))
    assert decision.outcome is Outcome.WAIT and decision.scope.level_name in ("node", "leaf")
    assert enforce.pins(decision, Config())


# -- protecting the waiting ---------------------------------------------------------------------

# A best fit for 4 GPUs: leaf-1's node with exactly 4 free, inside the waiter's spine-1; spine-2's
# node with 5 free is as tight (a node).
FREE = {"gpu-s1-l1-n1": 4, "gpu-s2-l5-n1": 5}


def test_new_work_keeps_off_what_a_pinned_wait_needs_when_as_tight_a_place_has_room(clock):
    index = busy_cluster(clock, FREE)
    assert place(index, request(1, 4)).nodes == ("gpu-s1-l1-n1",)  # no waiter: the best fit
    add_waiter(index)
    decision = place(index, request(1, 4))
    assert decision.nodes == ("gpu-s2-l5-n1",)
    assert any("kept off GPUs set aside for older waiting workloads in spine spine-1" in r for r in decision.reasons)
    held = place_and_reserve(index, request(1, 4), "ml/Job/small")  # the hold goes where the decision does
    assert held.nodes == ("gpu-s2-l5-n1",) and index.nodes["gpu-s1-l1-n1"].free == 4


def test_protection_never_turns_a_placement_into_a_wait(clock):
    index = busy_cluster(clock, {"gpu-s1-l1-n1": 4})
    add_waiter(index)
    decision = place(index, request(1, 4))
    assert decision.outcome is Outcome.PLACED and decision.nodes == ("gpu-s1-l1-n1",)
    assert any("no place as tight had room elsewhere" in r for r in decision.reasons)


def test_protection_never_widens_a_placement(clock):
    # 2 x 4 GPUs: a node of spine-1 holds both; outside it only two nodes of different leaves do.
    index = busy_cluster(clock, {"gpu-s1-l1-n1": 8, "gpu-s2-l5-n1": 4, "gpu-s2-l6-n1": 4})
    add_waiter(index)
    decision = place(index, request(2, 4))
    assert decision.nodes == ("gpu-s1-l1-n1",)  # the only place as tight is inside the wait's domain


def test_protection_lasts_protect_waiting_seconds(clock):
    index = busy_cluster(clock, FREE, Config(protect_waiting_seconds=600))
    add_waiter(index)
    clock.now += 599
    assert place(index, request(1, 4)).nodes == ("gpu-s2-l5-n1",)
    clock.now += 2
    assert place(index, request(1, 4)).nodes == ("gpu-s1-l1-n1",)
    off = busy_cluster(clock, FREE, Config(protect_waiting_seconds=0))
    add_waiter(off)
    assert place(off, request(1, 4)).nodes == ("gpu-s1-l1-n1",)


def test_a_workload_is_not_kept_off_its_own_wait_and_a_bound_waiter_is_forgotten(clock):
    index = busy_cluster(clock, FREE)
    waiting = add_waiter(index)
    assert place(index, request(1, 4), WAITER_KEY).nodes == ("gpu-s1-l1-n1",)
    for pod in waiting:
        feed.upsert(index, {**pod, "spec": {**pod["spec"], "nodeName": "gpu-s1-l2-n1"}}, "Pod")
    assert not index.pods.waiters
    assert place(index, request(1, 4)).nodes == ("gpu-s1-l1-n1",)


def test_only_the_waiters_need_is_protected_oldest_first(clock):
    # spine-1 has 4 + 8 free; a wait of 1 pod x 8 (pinned by max-domain) needs 8: the whole node.
    index = busy_cluster(clock, {**FREE, "gpu-s1-l2-n2": 8})
    add_waiter(index, pods=1)
    assert place(index, request(1, 4)).nodes == ("gpu-s1-l1-n1",)  # the 4 free GPUs are beyond its need
    clock.now += 1
    add_waiter(index, pods=1, key="ml/Job/later")  # a second wait, newer: its need takes the rest
    assert place(index, request(1, 4)).nodes == ("gpu-s2-l5-n1",)


def test_waits_are_left_as_they_are(clock):
    index = busy_cluster(clock, {"gpu-s1-l1-n1": 8, "gpu-s2-l5-n1": 4})
    alone = place(index, request(3))
    add_waiter(index, pods=3)  # an older wait in spine-1, which is also where this one fits first
    assert place(index, request(3)) == alone and alone.scope.name == "spine-1"


# -- a gated wait, decided again at a release ---------------------------------------------------

@pytest.mark.parametrize("free, started_in", [
    pytest.param({"gpu-s1-l2-n3": 8, "gpu-s1-l4-n1": 8}, "spine-1", id="its own domain holds it"),
    pytest.param({"gpu-s1-l2-n3": 8, "gpu-s2-l5-n1": 8, "gpu-s2-l5-n2": 8}, "leaf-5", id="a narrower one elsewhere"),
    pytest.param({"gpu-s1-l2-n3": 8, "gpu-s2-l5-n1": 8}, None, id="only across spines: wider, it waits"),
])
def test_a_gated_wait_starts_in_its_domain_or_one_no_wider(clock, free, started_in):
    """A 2-pod wait weighed to spine-1 (one node free there); later, at a release, it starts where a
    domain of spine level or narrower holds it, and nowhere wider (place_gated)."""
    wait = place(busy_cluster(clock, {"gpu-s1-l2-n3": 8}), request(2))
    assert wait.outcome is Outcome.WAIT and wait.scope.path == SPINE_1
    started = place_gated(busy_cluster(clock, free), request(2), wait.scope, WAITER_KEY)
    if started_in is None:
        assert started is None
        assert place(busy_cluster(clock, free), request(2)).scope.level_name == "zone"  # it would fit, wider
    else:
        assert started.outcome is Outcome.PLACED and started.scope.name == started_in
        assert any("behind its scheduling gate" in r for r in started.reasons)


def test_a_gated_wait_is_not_kept_off_its_own_domain_by_its_protection(clock):
    """Its own pending pods protect its domain against others, never against itself."""
    index = busy_cluster(clock, {"gpu-s1-l2-n3": 8, "gpu-s1-l4-n1": 8})
    add_waiter(index)
    wait = place(busy_cluster(clock, {"gpu-s1-l2-n3": 8}), request(2))
    started = place_gated(index, request(2), wait.scope, WAITER_KEY)
    assert started is not None and set(started.nodes) == {"gpu-s1-l2-n3", "gpu-s1-l4-n1"}
    assert place(index, request(2), "ml/Job/other").outcome is Outcome.PLACED  # never a wait for others either
