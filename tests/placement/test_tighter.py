"""A job that fits now only across a slower level waits for a tighter domain while the wait is worth
the stretch it saves, and no longer than the stretch allows (webhook/placement/tighter.py), with
`tight_wait_weight` 2 as tuned (0, off, is the default).

Cluster: test_waiting.py's, 2 spines x 4 leaves x 4 nodes x 8 H100, every GPU taken but the nodes
a test frees. Crossing spines costs (zone oversubscription 4), crossing leaves in a spine does not.
"""
import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.placement.test_placement_properties import build, clusters, requests
from tests.placement.test_waiting import busy_cluster, request, add_waiter
from webhook.core.model import Hold, Outcome, PlacementRequest, Strategy
from webhook.placement.placer import place, place_gated
from webhook.placement.tighter import tightest_level
from webhook.settings.config import Config

ONE_NODE_A_SPINE = {"gpu-s1-l2-n3": 8, "gpu-s2-l5-n1": 8}  # 2 pods of 8 fit only across the spines
KEY = "ml/Job/big"
ON, OFF = Config(tight_wait_weight=2.0), Config()  # as tuned; off by default


def test_a_job_that_fits_only_across_spines_waits_for_one_spine_when_the_stretch_is_worth_it(clock):
    """Across spines its run stretches by 0.1 x (1 - 1/4) x 4 = 0.29 run times (H100 NICs, NVLink's
    cap inside a spine); one more node frees in spine-1 after 1/15 run times, under 2 x 0.29."""
    decision = place(busy_cluster(clock, ONE_NODE_A_SPINE, ON), request(2))
    assert (decision.outcome, decision.hold) == (Outcome.WAIT, Hold.GATE)  # decided again at every release
    assert decision.scope.level_name == "spine" and decision.scope.name == "spine-1"
    assert decision.reasons[0] == (
        "it fits now in zone zone-a, which would stretch its run by 0.29 run times over spine spine-1, where "
        "room is expected in 0.07 run times (under 2 x the stretch): it waits there, up to 1028 s (0 s so far)")
    placed = place(busy_cluster(clock, ONE_NODE_A_SPINE, OFF), request(2))
    assert placed.outcome is Outcome.PLACED and placed.scope.level_name == "zone"  # the rule off: at once


def test_it_starts_across_the_spines_once_it_has_waited_what_the_stretch_allows(clock):
    """3600 s per run time of stretch: 0.29 run times allow 1028 s behind the gate."""
    index = busy_cluster(clock, ONE_NODE_A_SPINE, ON)
    wait = place(index, request(2))
    add_waiter(index, path=wait.scope.path, key=KEY)  # its pods, pending with the wait's annotation
    clock.now += 1000
    assert place_gated(index, request(2), wait.scope, KEY) is None
    clock.now += 30
    started = place_gated(index, request(2), wait.scope, KEY)
    assert started.outcome is Outcome.PLACED and started.scope.level_name == "zone"
    assert "it waited 1030 s for spine spine-1, past the 1028 s that a stretch of 0.29 run times allows " \
           "(tight_wait_seconds): it starts now" in started.reasons
    assert started.reasons[-1].endswith("behind its scheduling gate and starts in zone zone-a, wider, as the "
                                        "reasons above say")


def test_a_stretch_above_the_cap_never_ages_and_no_bound_waits_on(clock):
    for config in (dataclasses.replace(ON, tight_wait_cap=0.25), dataclasses.replace(ON, tight_wait_seconds=0.0)):
        index = busy_cluster(clock, ONE_NODE_A_SPINE, config)
        wait = place(index, request(2))
        assert wait.reasons[0].endswith("it waits there, with no bound: a stretch above tight_wait_cap never ages")
        add_waiter(index, path=wait.scope.path, key=KEY)
        clock.now += 86400
        assert place_gated(index, request(2), wait.scope, KEY) is None


def test_no_wait_where_room_is_expected_later_than_the_stretch_is_worth(clock):
    """16 pods: 8 nodes free in each spine, and the 8 more spine-1 needs free after H(8) = 2.7 run
    times, over 2 x 0.29: it spans the spines now, as without the rule."""
    free = {f"gpu-s{s}-l{leaf}-n{n}": 8 for s, leaves in ((1, (1, 2)), (2, (5, 6))) for leaf in leaves
            for n in range(1, 5)}
    decision = place(busy_cluster(clock, free, ON), request(16))
    assert decision == place(busy_cluster(clock, free, OFF), request(16))
    assert decision.outcome is Outcome.PLACED and decision.scope.level_name == "zone"


def test_only_waits_the_gate_holds(clock):
    """A pin would never be decided again, so never age: a Deployment's pods (`may_pin_wait` false),
    `gate_waits` off, and a distributed spread start now."""
    for config, req in ((ON, request(2, may_pin_wait=False)), (dataclasses.replace(ON, gate_waits=False), request(2)),
                        (ON, request(2, strategy=Strategy.DISTRIBUTED))):
        assert place(busy_cluster(clock, ONE_NODE_A_SPINE, config), req).outcome is Outcome.PLACED


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), requests, st.sampled_from([Strategy.CONSOLIDATED, Strategy.BALANCED]))
def test_the_rule_only_turns_a_placement_slower_than_the_tightest_level_into_a_gated_wait_narrower(
        nodes, shape, strategy):
    """On any small cluster, with the rule on a decision is the one without it, except a placement
    across a level slower than the tightest (one domain of which could hold the job idle), which may
    become a gated wait in a narrower domain saying what it saves; aged out, it is that placement."""
    pods, gpus = shape
    req = PlacementRequest("Job p/x", pods, gpus, strategy)
    without = place(build(nodes, OFF), req)
    index = build(nodes, ON)
    decision = place(index, req)
    aged = dataclasses.replace(place(index, dataclasses.replace(req, waited_seconds=1e9)), request=req)
    if decision == without:
        assert aged == without
        return
    assert without.outcome is Outcome.PLACED and without.scope.level < tightest_level(index.tree, req)
    assert (decision.outcome, decision.hold) == (Outcome.WAIT, Hold.GATE)
    assert decision.scope.level > without.scope.level and "stretch its run by" in decision.reasons[0]
    if "never ages" not in decision.reasons[0]:
        assert dataclasses.replace(aged, reasons=aged.reasons[:-1]) == without
