"""An admission's hold against the live view of the fake API server: provisional until the watch
shows the Job stored with our stamp, freed when the watch shows it deleted, and never freed or
taken over by a review alone (a review POSTed to the port by someone else, a DELETE review)."""
from __future__ import annotations

from conftest import LABELS, LEAF, eventually, patched_object, review_of
from tests.fixtures.builders import gpu_job
from tests.fixtures.shared import deletion

from webhook.admission import review
from webhook.core.injection import ADMISSION
from webhook.kube.demo import make_node
from webhook.settings.config import Config

CONFIG = Config(provisional_hold_seconds=10.0)


def synced(fake, make_view, nodes: int = 2):
    for i in range(nodes):
        fake.put_node(make_node(f"n{i}", {**LABELS, LEAF: "leaf-1"}))
    view = make_view(fake, CONFIG)
    view.start()
    assert view.wait_synced(10)
    return view


def admitted(view, job: dict) -> dict:
    sent = review_of(job)
    result = review(sent, view.index, CONFIG)
    assert result.outcome == "placed", result.warnings
    return patched_object(sent, result.review)


def reserved(view) -> int:
    return view.index.stats().gpus_reserved


def test_a_job_stored_as_admitted_keeps_its_hold_and_its_deletion_seen_frees_it(fake, make_view, clock):
    view = synced(fake, make_view)
    stored = admitted(view, gpu_job("train", 1, 8, placement_strategy="consolidated"))
    assert stored["metadata"]["annotations"][ADMISSION]
    fake.put("jobs", stored)  # the apiserver stored it: the watch brings it
    eventually(lambda: "ml/Job/train" in view.index.ledger.holds, what="the hold made firm")
    clock.now += CONFIG.provisional_hold_seconds + 1
    view.index.expire_reservations()
    assert reserved(view) == 8
    assert review(deletion(stored), view.index, CONFIG).outcome == "ignored" and reserved(view) == 8
    fake.delete("jobs", "ml/train")
    eventually(lambda: reserved(view) == 0, what="the deletion seen freeing the hold")


def test_a_review_the_apiserver_never_stored_holds_only_for_its_window(fake, make_view, clock):
    """A forged CREATE POSTed to the port, or one a later webhook or policy refused."""
    view = synced(fake, make_view)
    admitted(view, gpu_job("forged", 2, 8, placement_strategy="consolidated"))
    assert reserved(view) == 16 and "ml/Job/forged" in view.index.ledger.pending
    clock.now += CONFIG.provisional_hold_seconds + 1
    view.index.expire_reservations()
    assert reserved(view) == 0


def test_a_review_of_a_stored_jobs_name_takes_nothing_of_its_hold(fake, make_view, clock):
    view = synced(fake, make_view, nodes=3)
    stored = admitted(view, gpu_job("team-a", 1, 8, placement_strategy="consolidated"))
    fake.put("jobs", stored)
    eventually(lambda: "ml/Job/team-a" in view.index.ledger.holds, what="the hold made firm")
    held_before = dict(view.index.ledger.holds["ml/Job/team-a"].sets)
    admitted(view, gpu_job("team-a", 1, 1, gpu_count="1"))  # forged, under team-a's name
    assert view.index.ledger.holds["ml/Job/team-a"].sets == held_before
    clock.now += CONFIG.provisional_hold_seconds + 1
    view.index.expire_reservations()
    assert reserved(view) == 8 and view.index.ledger.holds["ml/Job/team-a"].sets == held_before
