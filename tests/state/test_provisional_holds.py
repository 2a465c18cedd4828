"""Holds an admission makes are provisional until the watch shows the apiserver stored what was
admitted (state/holds.py): a review can be refused after us, or not come from the apiserver at
all. What such a hold may never do: outlive its window unconfirmed, displace the hold of a stored
object, or be freed by anything but the watch."""
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.kube.demo import make_node
from webhook.objects.feed import parse_node
from webhook.settings.config import Config
from webhook.state.holds import ReservationLedger, Stored
from webhook.state.index import ClusterIndex

TTL, WINDOW = 300.0, 10.0
JOB = "ml/Job/train"


def ledger(clock) -> ReservationLedger:
    return ReservationLedger(TTL, clock, provisional_seconds=WINDOW)


def held(ledger: ReservationLedger, node: str = "n1") -> list:
    return sorted(ledger.held_on(node))


def test_an_admissions_hold_lapses_after_its_window_unless_the_object_is_seen_stored(clock):
    refused, stored = ledger(clock), ledger(clock)
    for each in (refused, stored):
        assert each.reserve(JOB, {"n1": [(0, 1)]}, stamp="uid-1") == {"n1"}
        assert held(each) == [(0, 1)] and JOB in each.pending
    assert stored.store(JOB, "uid-1") == {"n1"}  # the watch shows the Job with our stamp
    clock.now += WINDOW + 1
    assert refused.expire() == {"n1"} and held(refused) == [] and refused.hold(JOB) is None
    assert stored.expire() == set() and held(stored) == [(0, 1)] and JOB in stored.holds
    clock.now += TTL
    assert stored.expire() == {"n1"} and held(stored) == []


def test_an_object_seen_stored_before_its_hold_arrives_makes_it_firm_at_once(clock):
    """Another replica's claim may arrive after this replica's watch showed the object."""
    each = ledger(clock)
    each.store(JOB, "uid-1")
    each.reserve(JOB, {"n1": [(0,)]}, stamp="uid-1", ttl=100.0)
    assert JOB in each.holds and JOB not in each.pending
    clock.now += 50
    assert each.expire() == set() and held(each) == [(0,)]


def test_a_review_of_a_stored_objects_name_holds_beside_its_hold_and_never_takes_it_over(clock):
    each = ledger(clock)
    each.reserve(JOB, {"n1": [(0, 1, 2, 3)]}, stamp="real")
    each.store(JOB, "real")
    each.reserve(JOB, {"n2": [(0,)]}, stamp="forged")  # a review POSTed to the port, say
    assert held(each, "n1") == [(0, 1, 2, 3)] and held(each, "n2") == [(0,)]
    assert each.holds[JOB].stamp == "real" and each.pending[JOB].stamp == "forged"
    clock.now += WINDOW + 1
    assert each.expire() == {"n2"}
    assert held(each, "n1") == [(0, 1, 2, 3)] and held(each, "n2") == [] and each.holds[JOB].stamp == "real"


def test_the_newer_admission_stored_replaces_the_earlier_ones_hold(clock):
    """A Job re-admitted by its queue: the object now carries the newer stamp."""
    each = ledger(clock)
    each.reserve(JOB, {"n1": [(0,)]}, stamp="first")
    each.store(JOB, "first")
    each.reserve(JOB, {"n2": [(0,)]}, stamp="second")
    assert each.store(JOB, "second") == {"n1", "n2"}
    assert held(each, "n1") == [] and held(each, "n2") == [(0,)] and each.hold(JOB).stamp == "second"


def test_a_deletion_seen_frees_that_objects_holds_and_not_a_newer_admission_of_its_name(clock):
    """Deleted and re-created under the same name (Helm's before-hook-creation): the deletion
    may be seen after the new one was admitted."""
    each = ledger(clock)
    each.reserve(JOB, {"n1": [(0,)]}, stamp="old")
    each.store(JOB, "old")
    each.reserve(JOB, {"n2": [(0,)]}, stamp="new")
    assert each.unstore(JOB, "old") == {"n1"}
    assert held(each, "n1") == [] and held(each, "n2") == [(0,)]
    assert each.store(JOB, "new") == {"n2"} and JOB in each.holds


def test_placing_again_replaces_only_that_admissions_own_hold(clock):
    each = ledger(clock)
    each.reserve(JOB, {"n1": [(0,)]}, stamp="real")
    each.store(JOB, "real")
    each.reserve(JOB, {"n2": [(0,)]}, stamp="retry")
    assert each.release(JOB, "retry") == {"n2"} and JOB in each.holds  # what a retry of it drops first
    assert each.release(JOB) == {"n1"} and each.hold(JOB) is None  # the releaser's: every hold of the key


def test_without_a_watch_to_confirm_them_holds_are_firm_when_made(clock):
    each = ReservationLedger(TTL, clock)  # files, `mutate`
    each.reserve(JOB, {"n1": [(0,)]}, stamp="uid-1")
    clock.now += WINDOW + 1
    assert each.expire() == set() and JOB in each.holds


def test_a_pods_hold_counts_only_while_its_key_has_no_hold_firm_or_provisional(clock):
    each = ledger(clock)
    assert each.hold_pod("ml/p-0", JOB, "ml", "n1", (4,)) == {"n1"}
    each.reserve(JOB, {"n1": [(0,)]}, stamp="uid-1")
    assert held(each) == [(0,)]
    clock.now += WINDOW + 1
    assert each.expire() == {"n1"} and held(each) == [(4,)]


def test_the_index_reads_the_watchs_workload_facts(clock):
    config = Config()
    index = ClusterIndex(config, clock=clock)
    index.ledger.provisional_seconds = WINDOW
    index.apply(parse_node(make_node("n1", {"topology.scheduler/leaf": "l1"}, 8), config))
    index.reserve(JOB, {"n1": [(0, 1)]}, stamp="uid-1")
    index.apply(Stored(JOB, "uid-1"))
    clock.now += WINDOW + 1
    index.expire_reservations()
    assert index.stats().gpus_reserved == 2
    index.apply(Stored(JOB, "uid-1", gone=True))
    assert index.stats().gpus_reserved == 0 and index.keys("Job") == set()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["reserve", "store", "unstore", "release", "tick"]),
                          st.sampled_from(["a", "b", "c"]), st.sampled_from(["n1", "n2"])), max_size=30))
def test_any_sequence_leaves_each_node_holding_exactly_what_its_live_holds_say(steps):
    """Whatever reviews, stores, deletions and time do, a node counts the sets of the live holds
    on it, firm and provisional, and nothing unconfirmed lives past its window."""
    class Clock:
        now = 0.0

        def __call__(self):
            return self.now
    clock = Clock()
    each = ledger(clock)
    made_at: dict[str, float] = {}
    for action, stamp, node in steps:
        if action == "reserve":
            each.reserve(JOB, {node: [(0,)]}, stamp=stamp)
            made_at[stamp] = clock.now
        elif action == "store":
            each.store(JOB, stamp)
        elif action == "unstore":
            each.unstore(JOB, stamp)
        elif action == "release":
            each.release(JOB, stamp)
        else:
            clock.now += 4
            each.expire()
        live = [r for r in (each.holds.get(JOB), each.pending.get(JOB)) if r is not None]
        for name in ("n1", "n2"):
            assert sorted(each.held_on(name)) == sorted(s for r in live for s in r.sets.get(name, ()))
        provisional = each.pending.get(JOB)
        if provisional is not None:
            assert clock.now < made_at[provisional.stamp] + WINDOW
