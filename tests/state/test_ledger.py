"""The reservation ledger on its own: holds, confirmation by bound pods, expiry by its own clock,
and the namespace rule (nothing outside a hold's namespace confirms or releases it)."""
from webhook.core.injection import GPU_IDS
from webhook.core.injection import RESERVATION as RESERVATION_ANNOTATION
from webhook.core.model import PlacementRequest, Strategy
from webhook.kube.demo import make_node, make_pod
from webhook.objects import feed
from webhook.objects.feed import index_of
from webhook.placement.placer import place_and_reserve
from webhook.settings.config import Config
from webhook.state.holds import ReservationLedger

TTL = 300.0


def test_a_hold_is_confirmed_one_set_per_bound_pod_preferring_the_bound_node(clock):
    ledger = ReservationLedger(TTL, clock)
    assert ledger.reserve("ml/Job/a", {"n1": [(0, 1)], "n2": [(0, 1), (2, 3)]}) == {"n1", "n2"}
    assert ledger.confirm("ml/Job/a", "pod-1", "ml", "n2") == {"n2"}
    assert sorted(ledger.held_on("n2")) == [(0, 1)]
    assert ledger.confirm("ml/Job/a", "pod-1", "ml", "n2") == set()  # the same pod counts once
    assert ledger.confirm("ml/Job/a", "pod-2", "ml", "elsewhere") == {"n1"}  # bound off-plan: a held set goes
    assert ledger.confirm("ml/Job/a", "pod-3", "ml", "n2") == {"n2"}
    assert ledger.holds == {} and list(ledger.held_on("n1")) == list(ledger.held_on("n2")) == []


def test_holds_expire_by_the_ledgers_own_clock_and_a_renewal_restarts_it(clock):
    ledger = ReservationLedger(TTL, clock)
    ledger.reserve("ml/Job/a", {"n1": [(0,)]})
    clock.now += TTL - 1
    ledger.reserve("ml/Job/a", {"n1": [(0,)]})  # placed again: the hold lasts from now
    clock.now += 2
    assert ledger.expire() == set() and set(ledger.holds) == {"ml/Job/a"}
    clock.now += TTL
    assert ledger.expire() == {"n1"} and ledger.holds == {}


def test_a_hold_renewed_with_the_same_sets_changes_no_node_and_keeps_its_bound_pods(clock):
    """Another replica's claim renewed (its allotment, at each of its writes) costs no recount of
    its nodes, and the pods already counted against it are not counted again. Only the holder's
    own renewal: a hold is otherwise replaced, a new object (a gated release tells by it that
    another replica claimed the same workload)."""
    ledger = ReservationLedger(TTL, clock)
    ledger.reserve("ml/Job/a", {"n1": [(0,), (1,)], "n2": [(0,)]})
    assert ledger.confirm("ml/Job/a", "ml/a-0", "ml", "n2") == {"n2"}
    held = ledger.hold("ml/Job/a")
    assert not ledger.renew("ml/Job/a", {"n1": [(1,)]}, TTL * 2), "other sets: nothing renewed"
    assert ledger.renew("ml/Job/a", {"n1": [(0,), (1,)]}, TTL * 2) and ledger.hold("ml/Job/a") is held
    assert ledger.confirm("ml/Job/a", "ml/a-0", "ml", "n1") == set(), "counted once"
    clock.now += TTL + 1
    assert ledger.expire() == set() and ledger.hold("ml/Job/a").sets == {"n1": [(0,), (1,)]}
    clock.now += TTL
    assert ledger.expire() == {"n1"} and ledger.holds == {}
    assert not ledger.renew("ml/Job/a", {"n1": [(0,), (1,)]}, TTL), "no hold: nothing renewed"


def test_a_pod_of_another_namespace_confirms_nothing(clock):
    ledger = ReservationLedger(TTL, clock)
    ledger.reserve("team-victim/Job/train", {"n1": [(0, 1, 2, 3)]})
    assert ledger.confirm("team-victim/Job/train", "intruder", "attacker", "n1") == set()
    assert ledger.confirm("team-victim/Job/train", "intruder", "team", "n1") == set()  # a prefix is not the namespace
    assert sorted(ledger.held_on("n1")) == [(0, 1, 2, 3)]


def test_a_bound_pod_in_another_namespace_leaves_the_hold_on_the_index(clock):
    nodes = [make_node(f"n{i}", {"topology.scheduler/leaf": "l1"}, 8) for i in range(2)]
    index = index_of(Config(), nodes, [], clock)
    decision = place_and_reserve(index, PlacementRequest("Job team-victim/train", 2, 8, Strategy.CONSOLIDATED),
                                 "team-victim/Job/train")
    assert index.stats().gpus_reserved == 16
    forged = make_pod("forged", decision.nodes[0], 8, "attacker",
                      annotations={RESERVATION_ANNOTATION: "team-victim/Job/train"})
    feed.upsert(index, forged, "Pod")
    whole = [tuple(range(8))]
    assert set(index.ledger.holds) == {"team-victim/Job/train"}
    assert all(list(index.ledger.held_on(node)) == whole == index.nodes[node].held for node in decision.nodes)
    feed.delete(index, forged, "Pod")
    assert index.stats().gpus_reserved == 16


def test_a_hold_on_a_node_not_listed_yet_counts_once_the_node_arrives(clock):
    index = index_of(Config(), [], [], clock)
    index.reserve("ml/Job/elsewhere", {"late": [(0, 1, 2, 3, 4, 5, 6, 7)]})  # another replica's claim
    feed.upsert(index, make_node("late", {"topology.scheduler/leaf": "l1"}), "Node")
    assert index.stats().gpus_reserved == 8 and index.nodes["late"].free == 0


def test_holds_over_gpus_a_pod_or_another_hold_has_count_once(clock):
    """An allotment holds whole nodes: where it covers a running pod's GPUs or another claim's,
    a node is not counted short twice, and the stats add up to its GPUs."""
    index = index_of(Config(), [make_node("n", {"topology.scheduler/leaf": "l1"}, 8)],
                     [make_pod("running", "n", 4, "ml", annotations={GPU_IDS: "0-3"})], clock)
    index.reserve("ml/Job/claimed", {"n": [(4, 5)]})
    index.reserve("allotment/other-replica", {"n": [tuple(range(8))]})
    stats = index.stats()
    assert index.nodes["n"].free == 0
    assert (stats.gpus_used, stats.gpus_reserved, stats.gpus_total) == (4, 4, 8)
    index.release("allotment/other-replica")
    assert index.nodes["n"].free == 2 and index.stats().gpus_reserved == 2


def test_a_hold_replaced_changes_only_the_nodes_whose_sets_differ(clock):
    """A claim written again with one node more and one less (another replica's allotment, of a
    hundred nodes) costs two recounts, not a hundred; the pods' holds under its key count neither
    before nor after, so their nodes do not change, as they do when the hold is made or released."""
    ledger = ReservationLedger(TTL, clock)
    whole = [tuple(range(8))]
    ledger.hold_pod("ml/a-0", "ml/Job/a", "ml", "p", (0,))
    assert ledger.reserve("ml/Job/a", {f"n{i}": whole for i in range(100)}) == {f"n{i}" for i in range(100)} | {"p"}
    assert ledger.reserve("ml/Job/a", {f"n{i}": whole for i in range(1, 101)}) == {"n0", "n100"}
    assert ledger.reserve("ml/Job/a", {**{f"n{i}": whole for i in range(1, 101)}, "n5": [(0, 1)]}) == {"n5"}
    assert ledger.reserve("ml/Job/a", {f"n{i}": whole for i in range(1, 101)}, ttl=TTL * 2) == {"n5"}
    assert ledger.hold("ml/Job/a").expires_at == clock.now + TTL * 2, "still a new hold, for its own time"
    assert ledger.reserve("ml/Job/a", {}) == {f"n{i}" for i in range(1, 101)} | {"p"}


def test_an_index_whose_hold_was_replaced_counts_as_one_holding_the_new_sets_from_the_start(clock):
    nodes = [make_node(f"n{i}", {"topology.scheduler/leaf": f"l{i % 2}"}, 8) for i in range(6)]
    pods = [make_pod("running", "n1", 2, "ml", annotations={GPU_IDS: "0-1"})]
    replaced, fresh = index_of(Config(), nodes, pods, clock), index_of(Config(), nodes, pods, clock)
    replaced.reserve("allotment/r", {"n0": [tuple(range(8))], "n1": [tuple(range(8))], "n2": [(0, 1)]})
    new = {"n1": [tuple(range(8))], "n2": [(0, 1), (2, 3)], "n3": [(4,)]}
    replaced.reserve("allotment/r", new)
    fresh.reserve("allotment/r", new)
    assert {name: node.free for name, node in replaced.nodes.items()} == \
        {name: node.free for name, node in fresh.nodes.items()} == {"n0": 8, "n1": 0, "n2": 4, "n3": 7, "n4": 8, "n5": 8}
    assert replaced.stats() == fresh.stats()
    assert [leaf.free_gpus for leaf in replaced.tree.levels[-1].values()] == \
        [leaf.free_gpus for leaf in fresh.tree.levels[-1].values()]


def test_an_unbound_pods_own_hold_lasts_a_holds_time_from_when_it_was_first_seen(clock):
    """A sealed pod kept unbound behind someone else's gate holds no room for good (issue 59 item 5):
    past the TTL a later placement may take its room, and its next event does not hold it again."""
    ledger = ReservationLedger(TTL, clock)
    assert ledger.hold_pod("ml/p", "ml/Pod/p", "ml", "n1", (0, 1)) == {"n1"}
    clock.now += TTL - 1
    assert ledger.hold_pod("ml/p", "ml/Pod/p", "ml", "n1", (0, 1)) == set()  # an event of the same pod
    assert ledger.expire() == set() and sorted(ledger.held_on("n1")) == [(0, 1)]
    clock.now += 2
    assert ledger.expire() == {"n1"} and list(ledger.held_on("n1")) == []
    assert ledger.hold_pod("ml/p", "ml/Pod/p", "ml", "n1", (0, 1)) == set() and list(ledger.held_on("n1")) == []
    ledger.drop_pod("ml/p")  # bound, or gone: a pod of that key seen afresh holds afresh
    assert ledger.hold_pod("ml/p", "ml/Pod/p", "ml", "n1", (0, 1)) == {"n1"}
