"""Shared claims in process: live views of one fake API server, each with its claims Lease stream,
through the real `kubernetes` client. The two-process cases are in test_replicas.py."""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import LABELS, LEAF, eventually

from webhook.kube import allotment
from webhook.kube.claims_text import CLAIMS_ANNOTATION, LEASE_NAME, lease_body, read_claims
from webhook.kube.demo import make_node, make_pod
from webhook.core.model import Outcome, PlacementRequest, Strategy
from webhook.placement.placer import place_and_reserve, place_group, place_shared, release_shared

NAMESPACE = "tw"
LEASE = f"{NAMESPACE}/{LEASE_NAME}"


def whole_node(name: str) -> PlacementRequest:
    return PlacementRequest(f"Job ml/{name}", 1, 8, Strategy.CONSOLIDATED)


@pytest.fixture
def views(fake, make_view):
    for i in range(3):
        fake.put_node(make_node(f"n{i}", {**LABELS, LEAF: f"leaf-{i}"}))
    return started_pair(fake, make_view, budget_seconds=10)


def started_pair(fake, make_view, budget_seconds: float, allotments: bool = False) -> list:
    """Two replicas' live views sharing claims (with allotments, `allotments`), synced."""
    share = allotment.ALLOTMENT_SHARE if allotments else 0
    pair = [make_view(fake, claims_namespace=NAMESPACE, claims_budget_seconds=budget_seconds,
                      claims_allotment_share=share) for _ in range(2)]
    for view in pair:
        view.start()
        assert view.wait_synced(15)
    return pair


def reserved(view) -> int:
    return view.index.stats().gpus_reserved


def successful_writes(fake) -> list[tuple[str, str, int]]:
    return [w for w in fake.writes if w[2] < 300]


def test_a_replica_that_has_not_seen_the_other_claim_gets_409_and_decides_again(fake, views):
    a, b = views
    fake.hold_watches()  # b's Lease watch lags: it decides against the version before a's claim
    first, _ = place_shared(a.index, whole_node("a"), "ml/Job/a")
    second, warnings = place_shared(b.index, whole_node("b"), "ml/Job/b")
    fake.release_watches()
    assert first.nodes != second.nodes and not warnings
    assert [code for *_, code in fake.writes] == [201, 409, 200], "created, conflict, written after a new decision"
    eventually(lambda: reserved(a) == reserved(b) == 16, what="both claims on both replicas")


def test_a_write_of_ours_the_watch_brings_before_its_answer_leaves_decisions_made_before_it_valid(
        fake, views, monkeypatch):
    a, _ = views
    claims = a.index.shared_claims
    place_shared(a.index, whole_node("first"), "ml/Job/first")
    place_and_reserve(a.index, whole_node("held"), "ml/Job/held")  # decided; its claim not written yet
    basis = claims.basis()
    replace = claims.api.replace_namespaced_lease

    def watch_first(*args, **kwargs):
        response = replace(*args, **kwargs)
        claims.apply(fake.get("leases", LEASE))  # the watch's event, before the write's answer
        return response
    monkeypatch.setattr(claims.api, "replace_namespaced_lease", watch_first)
    place_shared(a.index, whole_node("next"), "ml/Job/next")
    assert claims.claim("ml/Job/held", basis, time.monotonic() + 5) is None, \
        "only our own write came after its decision: written, not decided again"
    assert set(read_claims(fake.get("leases", LEASE))) == {"ml/Job/first", "ml/Job/held", "ml/Job/next"}
    assert [code for *_, code in fake.writes] == [201, 200, 200]


def test_dry_runs_waits_and_releases_of_unshared_holds_write_nothing(fake, views):
    a, _ = views
    assert place_shared(a.index, whole_node("dry"), None)[0].outcome is Outcome.PLACED
    release_shared(a.index, "ml/Job/never-placed")
    assert fake.writes == []
    for name in ("x", "y", "z"):
        place_shared(a.index, whole_node(name), f"ml/Job/{name}")
    assert place_shared(a.index, whole_node("w"), "ml/Job/w")[0].outcome is Outcome.WAIT
    assert len(fake.writes) == 3, "one write per placed workload, none for the one that waits"


def test_a_writer_keeps_the_others_claims_and_drops_what_its_ledger_no_longer_holds(fake, views, clock):
    a, b = views
    place_shared(a.index, whole_node("a"), "ml/Job/a")
    eventually(lambda: reserved(b) == 8, what="a's claim on b")
    clock.now += a.index.ledger.ttl_seconds + 1  # both ledgers let ml/Job/a lapse
    a.index.expire_reservations()
    b.index.expire_reservations()
    place_shared(b.index, whole_node("b"), "ml/Job/b")
    assert set(read_claims(fake.get("leases", LEASE))) == {"ml/Job/b"}


def test_claims_that_cannot_be_read_or_have_lapsed_are_skipped(fake, views):
    a, _ = views
    claims = {"ml/Job/ok": {"expires": time.time() + 60, "sets": {"n0": ["0-7"]}},
              "ml/Job/lapsed": {"expires": time.time() - 1, "sets": {"n1": ["0-7"]}},
              "ml/Job/broken": {"expires": "soon", "sets": {"n2": ["0-7"]}},
              "ml/Job/garbled": {"expires": time.time() + 60, "sets": {"n2": ["seven"]}}}
    fake.put("leases", {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": LEASE_NAME, "namespace": NAMESPACE,
                                     "annotations": {CLAIMS_ANNOTATION: json.dumps(claims)}}})
    eventually(lambda: reserved(a) == 8, what="the readable claim")
    assert set(a.index.ledger.holds) == {"ml/Job/ok"}
    assert a.readiness()[0]


def test_a_placement_made_again_moves_its_claim_on_every_replica(fake, views):
    a, b = views
    first, _ = place_shared(a.index, whole_node("a"), "ml/Job/a")
    eventually(lambda: set(b.index.ledger.holds) == {"ml/Job/a"}, what="the claim on b")
    cordoned = first.nodes[0]
    fake.put_node(make_node(cordoned, {**LABELS, LEAF: f"leaf-{cordoned[1:]}"}, unschedulable=True))
    eventually(lambda: a.index.stats().gpus_total == 16, what="the cordon seen by a")
    again, _ = place_shared(a.index, whole_node("a"), "ml/Job/a")
    assert again.nodes != first.nodes
    eventually(lambda: tuple(b.index.ledger.holds["ml/Job/a"].sets) == again.nodes, what="the moved claim on b")


@pytest.mark.parametrize("flags, message", [
    (["--nodes", "nodes.yaml", "--claims-namespace", "tw"], "--claims-namespace shares holds through the API"),
    (["--claims-budget", "0"], "--claims-budget 0.0 must be a positive number of seconds"),
], ids=["without the live view", "no budget"])
def test_serve_refuses_claims_it_cannot_keep(flags, message, capsys, tmp_path, monkeypatch):
    from webhook.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "nodes.yaml").write_text(json.dumps(make_node("n0", LABELS)))
    assert main(["serve", *flags]) == 2
    assert message in capsys.readouterr().err


def test_a_claim_decided_before_another_replicas_claims_arrived_is_decided_again_without_a_write(fake, views):
    a, b = views
    stale = b.index.shared_claims.basis()
    place_shared(a.index, whole_node("a"), "ml/Job/a")
    eventually(lambda: b.index.shared_claims.basis() != stale, what="a's claim on b")
    writes = len(fake.writes)
    assert b.index.shared_claims.claim("ml/Job/b", stale, time.monotonic() + 5) == "conflict"
    assert len(fake.writes) == writes


def test_in_a_pod_claims_default_to_its_own_namespace(tmp_path, monkeypatch):
    from webhook.kube import clusterview

    monkeypatch.setattr(clusterview, "SERVICE_ACCOUNT_NAMESPACE", str(tmp_path / "namespace"))
    assert clusterview.own_namespace() is None, "outside a pod there is none"
    (tmp_path / "namespace").write_text("topology-system\n")
    assert clusterview.own_namespace() == "topology-system"


def test_a_relist_of_the_lease_after_410_keeps_claims_once_and_releases_what_went_meanwhile(fake, views):
    a, b = views
    place_shared(a.index, whole_node("a"), "ml/Job/a")
    place_shared(a.index, whole_node("b"), "ml/Job/b")
    eventually(lambda: reserved(b) == 16, what="both claims on b")
    fake.hold_watches()  # b sees nothing of what follows until its relist
    release_shared(a.index, "ml/Job/a")
    fake.compact()
    fake.break_watches()
    fake.release_watches()
    eventually(lambda: set(b.index.ledger.holds) == {"ml/Job/b"}, what="the relisted Lease applied on b")
    assert reserved(b) == 8
    assert next(s for s in b.status() if s.kind == "leases").lists == 2


def test_a_group_member_on_another_replica_joins_the_nodes_the_first_replica_claimed(fake, make_view):
    for leaf in (1, 2):
        for n in range(2):
            fake.put_node(make_node(f"l{leaf}n{n}", {**LABELS, LEAF: f"leaf-{leaf}"}))
    a, b = started_pair(fake, make_view, budget_seconds=10)
    group = PlacementRequest("PyTorchJob ml/bert", 2, 8, Strategy.CONSOLIDATED)
    first, _, joined = place_group(a.index, group, "ml/PyTorchJob/bert", reserve=True)
    assert not joined and first.outcome is Outcome.PLACED
    eventually(lambda: "ml/PyTorchJob/bert" in b.index.ledger.holds, what="a's claim on b")
    for n in range(2):  # a tighter fit appears after a decided: b alone would now choose it
        fake.put_node(make_node(f"l0n{n}", {**LABELS, LEAF: "leaf-0"}))
    eventually(lambda: len(b.index.nodes) == 6, what="the new leaf on b")
    second, _, _ = place_group(b.index, group, "ml/PyTorchJob/bert", reserve=True)
    assert second.nodes == first.nodes and second.requirements == first.requirements


@pytest.fixture
def wide_views(fake, make_view):
    """Two replicas over 32 nodes in leaves of 4: a leaf (32 GPUs) is at most 1/8 of the free GPUs,
    small enough to be a replica's allotment."""
    for i in range(32):
        fake.put_node(make_node(f"n{i}", {**LABELS, LEAF: f"leaf-{i // 4}"}))
    return started_pair(fake, make_view, budget_seconds=2, allotments=True)


def leaf_of(node: str) -> int:
    return int(node[1:]) // 4


def test_a_placement_inside_the_allotment_is_answered_without_a_write_and_written_soon_after(fake, wide_views):
    a, b = wide_views
    first, _ = place_shared(a.index, whole_node("first"), "ml/Job/first")
    assert len(successful_writes(fake)) == 1
    claims = read_claims(fake.get("leases", LEASE))
    allotment = claims.keys() - {"ml/Job/first"}
    assert len(allotment) == 1 and next(iter(allotment)).startswith("allotment/")
    allotted = claims[next(iter(allotment))]["sets"]
    assert {leaf_of(node) for node in allotted} == {leaf_of(first.nodes[0])} and len(allotted) == 4, \
        "the first placement's leaf"
    assert all(sets == ["0-7"] for sets in allotted.values()), \
        "whole nodes: GPUs freed on them later are the allotment's too"
    second, warnings = place_shared(a.index, whole_node("second"), "ml/Job/second")
    assert second.nodes[0] in allotted and not warnings
    assert len(successful_writes(fake)) == 1, "taken from the allotment: no write before the answer"
    eventually(lambda: "ml/Job/second" in read_claims(fake.get("leases", LEASE)), what="the placement written")
    claims = read_claims(fake.get("leases", LEASE))
    assert claims[next(iter(allotment))]["sets"] == allotted, "the allotment renewed where it was"
    eventually(lambda: reserved(b) == 32, what="a's placements and what is left of its allotment, held on b")
    for name in ("x", "y", "z"):
        placed, _ = place_shared(b.index, whole_node(name), f"ml/Job/{name}")
        assert leaf_of(placed.nodes[0]) != leaf_of(first.nodes[0]), "never on a's allotment"


def test_an_allotment_renewed_where_it_was_only_lasts_longer_on_the_other_replica(fake, wide_views):
    a, b = wide_views
    place_shared(a.index, whole_node("first"), "ml/Job/first")
    key = a.index.shared_claims.allotment.key
    written = read_claims(fake.get("leases", LEASE))[key]
    held = eventually(lambda: b.index.ledger.hold(key), what="a's allotment held on b")
    place_shared(a.index, whole_node("second"), "ml/Job/second")  # taken from it: the flush renews it
    eventually(lambda: "ml/Job/second" in b.index.ledger.holds, what="the flush applied on b")
    renewed = read_claims(fake.get("leases", LEASE))[key]
    assert renewed["sets"] == written["sets"] and renewed["expires"] > written["expires"]
    assert b.index.ledger.hold(key) is held, "the same hold, lasting longer: no node counted again"


def test_gpus_freed_on_an_allotted_node_after_the_allotment_was_written_are_taken_without_a_write(fake, make_view):
    for i in range(32):
        fake.put_node(make_node(f"n{i}", {**LABELS, LEAF: f"leaf-{i // 4}"}))
    fake.put_pod(make_pod("busy", "n0", 8, namespace="ml"))  # leaf-0 the tightest fit: three nodes free
    a, b = started_pair(fake, make_view, budget_seconds=2, allotments=True)
    placed = [place_shared(a.index, whole_node(name), f"ml/Job/{name}")[0] for name in ("j1", "j2", "j3")]
    assert {leaf_of(decision.nodes[0]) for decision in placed} == {0}
    eventually(lambda: "ml/Job/j3" in read_claims(fake.get("leases", LEASE)), what="the placements written")
    allotted = next(claim for key, claim in read_claims(fake.get("leases", LEASE)).items()
                    if key.startswith(allotment.ALLOTMENT_PREFIX))["sets"]
    assert allotted == {f"n{i}": ["0-7"] for i in range(4)}, "the whole leaf, the busy node too"
    fake.delete("pods", "ml/busy")  # its pod ended: n0 is free, and no write says so
    eventually(lambda: a.index.nodes["n0"].free == 8, what="the pod's end seen by a")
    writes = len(successful_writes(fake))
    fourth, warnings = place_shared(a.index, whole_node("j4"), "ml/Job/j4")
    assert fourth.nodes == ("n0",) and not warnings
    assert len(successful_writes(fake)) == writes, "inside the allotment: no write before the answer"
    eventually(lambda: b.index.nodes["n0"].free == 0 and "ml/Job/j4" in b.index.ledger.holds,
               what="the placement written and held on b")
    taken, _ = place_shared(b.index, whole_node("other"), "ml/Job/other")
    assert leaf_of(taken.nodes[0]) != 0


def test_an_allotment_stays_in_its_domain_when_a_spread_lands_elsewhere(fake, wide_views):
    a, _ = wide_views
    place_shared(a.index, whole_node("first"), "ml/Job/first")
    domain = a.index.shared_claims.allotment.path
    spread, _ = place_shared(a.index, PlacementRequest("Job ml/spread", 2, 8, Strategy.DISTRIBUTED), "ml/Job/spread")
    assert any(a.index.tree.nodes[node].path[:len(domain)] != domain for node in spread.nodes), "a spread misses it"
    eventually(lambda: "ml/Job/spread" in read_claims(fake.get("leases", LEASE)), what="the spread written")
    assert a.index.shared_claims.allotment.path == domain, "not moved to where the spread went"


def test_spreads_are_answered_without_a_write_from_nodes_across_leaves_the_allotment_holds_for_them(
        fake, wide_views):
    a, b = wide_views
    place_shared(a.index, whole_node("first"), "ml/Job/first")
    place_shared(a.index, spread_of("s1", 2), "ml/Job/s1")  # asks: none held for spreads yet
    assert len(successful_writes(fake)) == 2, "written before its answer"
    claim = next(claim for key, claim in read_claims(fake.get("leases", LEASE)).items()
                 if key.startswith(allotment.ALLOTMENT_PREFIX))
    spread_nodes = set(claim["spread"])
    assert len({leaf_of(node) for node in spread_nodes}) == len(spread_nodes) >= 2, "one node per leaf"
    assert spread_nodes <= claim["sets"].keys(), "held whole by the other replicas like the rest of it"
    second, warnings = place_shared(a.index, spread_of("s2", 2), "ml/Job/s2")
    assert set(second.nodes) <= spread_nodes and len({leaf_of(node) for node in second.nodes}) == 2
    assert not warnings and len(successful_writes(fake)) == 2, "taken from the allotment: no write before the answer"
    assert second.request == spread_of("s2", 2), "decided on those nodes, recorded as asked"
    wide, _ = place_shared(a.index, spread_of("wide", 8, gpus=1), "ml/Job/wide")
    assert len({leaf_of(node) for node in wide.nodes}) == 8, "more pods than those leaves: spread over all of them"
    assert len(successful_writes(fake)) == 3
    eventually(lambda: "ml/Job/s2" in read_claims(fake.get("leases", LEASE)), what="the spread written after")
    eventually(lambda: all(b.index.nodes[node].free == 0 for node in spread_nodes), what="held on b")


def spread_of(name: str, pods: int, gpus: int = 4) -> PlacementRequest:
    return PlacementRequest(f"Job ml/{name}", pods, gpus, Strategy.DISTRIBUTED)


def test_two_replicas_placing_at_once_from_their_allotments_never_share_a_gpu(fake, wide_views):
    a, b = wide_views
    requests = [(view, PlacementRequest(f"Job ml/j{i}", 1, 1 + i % 4, Strategy.CONSOLIDATED), f"ml/Job/j{i}")
                for i in range(80) for view in (wide_views[i % 2],)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        decisions = list(pool.map(lambda r: place_shared(r[0].index, r[1], r[2]), requests))
    taken: dict[str, set[int]] = {}
    for decision, warnings in decisions:
        assert not warnings and decision.outcome is Outcome.PLACED
        for assigned in decision.assignment:
            on_node = taken.setdefault(assigned.node, set())
            assert on_node.isdisjoint(assigned.gpu_ids), f"GPUs of {assigned.node} given twice"
            on_node.update(assigned.gpu_ids)
    writes = len(successful_writes(fake))
    assert writes < len(requests) / 2, f"{writes} writes for {len(requests)} placements: most came from allotments"
    eventually(lambda: not a.index.shared_claims.allotment.spent and not b.index.shared_claims.allotment.spent, what="all written")
    held = read_claims(fake.get("leases", LEASE))
    assert {f"ml/Job/j{i}" for i in range(80)} <= held.keys()


def test_an_allotment_unused_for_a_while_is_given_back(fake, wide_views, monkeypatch):
    monkeypatch.setattr(allotment, "ALLOTMENT_IDLE_SECONDS", 0.5)
    a, b = wide_views
    place_shared(a.index, whole_node("only"), "ml/Job/only")
    eventually(lambda: reserved(b) == 32, what="the claim and the allotment on b")
    eventually(lambda: set(read_claims(fake.get("leases", LEASE))) == {"ml/Job/only"}, what="the allotment given back")
    eventually(lambda: reserved(b) == 8, what="only the claim held on b")
    assert a.index.shared_claims.allotted() is None


def test_placements_outside_the_allotment_or_near_its_end_are_written_before_the_answer(fake, wide_views):
    a, _ = wide_views
    first, _ = place_shared(a.index, whole_node("first"), "ml/Job/first")
    elsewhere = f"leaf-{(leaf_of(first.nodes[0]) + 4) % 8}"
    outside, _ = place_shared(a.index, PlacementRequest("Job ml/outside", 1, 8, Strategy.CONSOLIDATED,
                                                        preferred_domain=elsewhere), "ml/Job/outside")
    assert f"leaf-{leaf_of(outside.nodes[0])}" == elsewhere
    assert len(successful_writes(fake)) == 2, "outside the allotment: written before the answer"
    allotted = a.index.shared_claims.allotment
    allotted.wall = lambda: time.time() + allotted.seconds - 2  # 2 s of its 10 left, under the budget + 1 s
    assert allotted.allotted() is None
    place_shared(a.index, whole_node("late"), "ml/Job/late")
    assert len(successful_writes(fake)) == 3, "too little time left to write it after the answer"


def leave_4_gpus_in_the_allotment_of(fake, view, first) -> None:
    """Pods the scheduler bound on the allotment's other nodes (4 GPUs of the leaf left free: an
    allotment moves from a domain with less than a quarter of its bound free), seen by every view."""
    allotted = set(view.index.shared_claims.allotment.gpus)
    for node, gpus in zip(sorted(allotted - set(first.nodes)), (8, 8, 4)):
        fake.put_pod(make_pod(f"bound-{node}", node, gpus, namespace="other"))
    eventually(lambda: sum(view.index.nodes[node].free for node in allotted) == 4, what="the bound pods seen")


def test_while_a_write_is_in_flight_only_gpus_the_next_allotment_keeps_are_taken(fake, wide_views, monkeypatch):
    a, _ = wide_views
    first, _ = place_shared(a.index, whole_node("first"), "ml/Job/first")
    allotted = set(a.index.shared_claims.allotment.gpus)
    leave_4_gpus_in_the_allotment_of(fake, a, first)  # too little to stay in: the next write moves it
    elsewhere = f"leaf-{(leaf_of(first.nodes[0]) + 4) % 8}"
    claims, decided = a.index.shared_claims, threading.Event()
    real_write = claims._write

    def write_once_decided(body: dict, deadline: float) -> str | None:
        decided.wait(5)  # the write moving the allotment stays in flight until "inside" is decided
        return real_write(body, deadline)
    monkeypatch.setattr(claims, "_write", write_once_decided)
    with ThreadPoolExecutor(max_workers=2) as pool:
        moving = pool.submit(place_shared, a.index, PlacementRequest(
            "Job ml/outside", 1, 8, Strategy.CONSOLIDATED, preferred_domain=elsewhere), "ml/Job/outside")
        eventually(lambda: claims.allotment.next is not None, what="the write in flight")
        placing = pool.submit(place_shared, a.index, PlacementRequest("Job ml/inside", 1, 4, Strategy.CONSOLIDATED),
                              "ml/Job/inside")
        eventually(lambda: a.index.ledger.hold("ml/Job/inside") is not None, what="inside decided")
        decided.set()
        moving.result()
        inside, _ = placing.result()
    assert inside.nodes[0] in allotted
    assert len(successful_writes(fake)) == 3, \
        "the in-flight write moves the allotment to the other leaf: a placement in the old one is written itself"


def test_a_replica_stopped_gives_its_allotment_back_and_writes_what_it_took(fake, wide_views):
    a, b = wide_views
    place_shared(a.index, whole_node("first"), "ml/Job/first")
    place_shared(a.index, whole_node("second"), "ml/Job/second")  # taken from the allotment
    assert a.stop()
    assert set(read_claims(fake.get("leases", LEASE))) == {"ml/Job/first", "ml/Job/second"}
    eventually(lambda: reserved(b) == 16, what="only the two placements held on b")


def test_after_a_write_whose_outcome_is_unknown_only_gpus_both_allotments_hold_are_taken(fake, wide_views, monkeypatch):
    a, b = wide_views
    claims = a.index.shared_claims
    first, _ = place_shared(a.index, whole_node("first"), "ml/Job/first")
    leave_4_gpus_in_the_allotment_of(fake, a, first)  # too little to stay in: the next write moves it
    fake.hold_watches()  # a's watch lags from now on, and a does not read its next write back
    read_back = claims.apply
    monkeypatch.setattr(claims, "apply", lambda *args, **kwargs: None)
    real_write = claims._write
    monkeypatch.setattr(claims, "_write", lambda body, deadline: real_write(body, deadline) or "ReadTimeoutError")
    elsewhere = f"leaf-{(leaf_of(first.nodes[0]) + 4) % 8}"
    _, warnings = place_shared(a.index, PlacementRequest("Job ml/moved", 1, 8, Strategy.CONSOLIDATED,
                                                         preferred_domain=elsewhere), "ml/Job/moved")
    assert warnings, "its answer was lost: made alone, as far as a knows"
    # The write was made: the allotment moved to the other leaf, and b may use the first leaf's GPUs.
    b.index.shared_claims._refresh(time.monotonic() + 2)
    taken_by_b = place_shared(b.index, PlacementRequest("Job ml/b", 1, 4, Strategy.CONSOLIDATED,
                                                        preferred_domain=f"leaf-{leaf_of(first.nodes[0])}"),
                              "ml/Job/b")[0].nodes
    assert {leaf_of(node) for node in taken_by_b} == {leaf_of(first.nodes[0])}
    monkeypatch.setattr(claims, "_write", real_write)
    monkeypatch.setattr(claims, "apply", read_back)  # what a reads after a 409 it applies again
    inside, _ = place_shared(a.index, PlacementRequest("Job ml/inside", 1, 4, Strategy.CONSOLIDATED), "ml/Job/inside")
    fake.release_watches()
    assert inside.nodes[0] not in taken_by_b, "a took a GPU of its old allotment that the made write gave up"


def test_a_placement_taken_again_while_its_first_is_being_written_stays_held_and_is_written(fake, wide_views):
    a, _ = wide_views
    claims = a.index.shared_claims
    place_shared(a.index, whole_node("first"), "ml/Job/first")
    before, _ = place_shared(a.index, whole_node("k"), "ml/Job/k")
    assert "ml/Job/k" in claims.allotment.spent
    real_write, again = claims._write, {}

    def placed_again_meanwhile(body, deadline):  # the flush is in flight when the workload is placed anew
        claims._write = real_write
        with a.index.lock:
            node = next(n for n in sorted(claims.allotment.next) if n != before.nodes[0])
            a.index.release("ml/Job/k")
            a.index.reserve("ml/Job/k", {node: [tuple(range(8))]})
            assert claims.spend("ml/Job/k")
            again["node"] = node
        return real_write(body, deadline)
    claims._write = placed_again_meanwhile
    eventually(lambda: "node" in again and not claims.allotment.spent, what="both written")
    assert tuple(a.index.ledger.hold("ml/Job/k").sets) == (again["node"],), "the own write's echo replaced nothing"
    assert tuple(read_claims(fake.get("leases", LEASE))["ml/Job/k"]["sets"]) == (again["node"],)


def fill_all_but_the_allotment_of(a, b) -> set[str]:
    """a places once (and takes the rest of that leaf as its allotment); b fills every other node.
    Returns the nodes of a's allotment."""
    first, _ = place_shared(a.index, whole_node("first"), "ml/Job/first")
    eventually(lambda: reserved(b) == 32, what="a's claim and allotment held on b")
    allotted = set(a.index.shared_claims.allotment.gpus)
    for i in range(28):
        placed, _ = place_shared(b.index, whole_node(f"b{i}"), f"ml/Job/b{i}")
        assert placed.outcome is Outcome.PLACED and placed.nodes[0] not in allotted | {first.nodes[0]}
    return allotted


def test_a_wait_for_room_only_another_replicas_allotment_has_asks_for_it_back_and_is_placed(fake, wide_views):
    # Found in the end-to-end suite: a replica that took another's allotment for busy GPUs pinned
    # its waits where they never started (docs/design/ledger-and-claims.md).
    a, b = wide_views
    allotted = fill_all_but_the_allotment_of(a, b)
    decision, warnings = place_shared(b.index, whole_node("last"), "ml/Job/last")
    assert decision.outcome is Outcome.PLACED and decision.nodes[0] in allotted and not warnings
    claims = read_claims(fake.get("leases", LEASE))
    assert not any(key.startswith(allotment.ALLOTMENT_PREFIX) and key.endswith(a.index.shared_claims.identity)
                   for key in claims), "a gave its allotment back"
    assert any(key.startswith(allotment.WANT_PREFIX) for key in claims), "b asked for it"
    assert a.index.shared_claims.allotted() is None, "a takes nothing more from it while it is wanted"
    eventually(lambda: reserved(a) == reserved(b) == 30 * 8, what="both replicas hold every placement")


def test_a_wait_that_no_allotment_could_end_asks_for_nothing(fake, wide_views):
    a, b = wide_views
    allotted = fill_all_but_the_allotment_of(a, b)
    too_big = PlacementRequest("Job ml/big", len(allotted) + 1, 8, Strategy.CONSOLIDATED)
    started = time.monotonic()
    assert place_shared(b.index, too_big, "ml/Job/big")[0].outcome is Outcome.WAIT
    assert time.monotonic() - started < 1.0, "answered at once, not after the claims' budget"
    assert not any(key.startswith(allotment.WANT_PREFIX) for key in read_claims(fake.get("leases", LEASE)))
    assert set(a.index.shared_claims.allotment.gpus) == allotted, "a keeps its allotment"


def test_what_a_replica_took_from_its_allotment_before_it_was_asked_back_is_never_given_twice(fake, wide_views):
    a, b = wide_views
    allotted = fill_all_but_the_allotment_of(a, b)
    writes = len(successful_writes(fake))
    mine, _ = place_shared(a.index, whole_node("mine"), "ml/Job/mine")
    assert mine.nodes[0] in allotted and len(successful_writes(fake)) == writes, "taken from a's allotment, unwritten"
    last, _ = place_shared(b.index, whole_node("last"), "ml/Job/last")  # asks at once, before a's flush or after
    assert last.outcome is Outcome.PLACED and last.nodes[0] in allotted and last.nodes[0] != mine.nodes[0]
    claims = eventually(lambda: (held := read_claims(fake.get("leases", LEASE))).keys() >= {"ml/Job/mine", "ml/Job/last"}
                        and held, what="both written")
    assert claims["ml/Job/mine"]["sets"].keys() != claims["ml/Job/last"]["sets"].keys()


def test_a_wanted_allotment_is_taken_from_no_more_and_given_back_with_the_next_write(fake, wide_views):
    a, _ = wide_views
    place_shared(a.index, whole_node("first"), "ml/Job/first")
    mine = a.index.shared_claims.allotment
    with a.index.lock:
        assert mine.allotted() is not None
        mine.wanted_until = mine.wall() + 5  # as a version of the Lease asking for it would set it
    writes = len(successful_writes(fake))
    second, _ = place_shared(a.index, whole_node("second"), "ml/Job/second")
    assert len(successful_writes(fake)) == writes + 1, "written before the answer, not taken from the allotment"
    assert not any(key.startswith(allotment.ALLOTMENT_PREFIX) for key in read_claims(fake.get("leases", LEASE))), \
        "that write gave the allotment back"


def test_an_ask_that_cannot_be_written_answers_the_wait_at_once(fake, wide_views):
    a, b = wide_views
    fill_all_but_the_allotment_of(a, b)
    fake.refuse_writes = True
    started = time.monotonic()
    assert place_shared(b.index, whole_node("last"), "ml/Job/last")[0].outcome is Outcome.WAIT
    assert time.monotonic() - started < 0.5, "not retried until the budget runs out"


def test_a_claim_read_again_unchanged_is_the_object_read_before():
    """How a replica applies a version cheaply: the claims it had read come back as the same
    objects (one identity check each in the ledger), the changed ones as new ones."""
    def lease(claims):
        return lease_body(claims, NAMESPACE, "replica-a", None, 30)
    kept, moved = ({"expires": 100.0, "sets": {node: ["0-3"]}} for node in ("n0", "n1"))
    before = read_claims(lease({"ml/Job/kept": kept, "ml/Job/moved": moved}))
    after = read_claims(lease({"ml/Job/kept": kept, "ml/Job/moved": {**moved, "sets": {"n2": ["0-3"]}}}), before)
    assert after["ml/Job/kept"] is before["ml/Job/kept"]
    assert after["ml/Job/moved"] is not before["ml/Job/moved"] and after["ml/Job/moved"]["sets"] == {"n2": ["0-3"]}
