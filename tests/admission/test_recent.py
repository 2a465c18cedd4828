"""The topology page's recent decisions: this replica's in memory, the other replicas' merged in, and
the record a replica writes of its own (webhook/kube/shared_decisions.py writes and reads it)."""
from __future__ import annotations

import base64
import json
import zlib

import pytest

from webhook.admission.recent import RecentDecisions, RecordedDecision, decode_record, encode_record
from webhook.serving.page.snapshot import Selection, latest_per_workload


def decision(i: int, replica: str = "a", name: str | None = None, reasons: int = 2) -> RecordedDecision:
    return RecordedDecision(at=1000.0 + i, namespace="ml", kind="Job", name=name or f"job-{i}", outcome="placed",
                            gpus=32, domain="leaf leaf-3", code=None,
                            reasons=tuple(f"4 pod(s) x 8 GPU(s) in leaf leaf-3: reason {r} of {i}"
                                          for r in range(reasons)),
                            nodes=tuple(f"gpu-s1-l3-n{n}" for n in range(4)), replica=replica)


def test_a_record_gives_back_the_decisions_it_was_written_from_as_the_writers():
    entries = [decision(i) for i in range(500)]
    text, kept = encode_record(entries, 128 * 1024)
    assert kept == 500 and len(text) < 40_000  # compressed: the JSON alone is several times that
    assert decode_record(text, "a") == entries
    assert {entry.replica for entry in decode_record(text, "webhook-1")} == {"webhook-1"}  # named by who wrote it


def test_a_record_over_its_size_keeps_the_newest_decisions_that_fit():
    entries = [decision(i, reasons=1) for i in range(500)]
    text, kept = encode_record(entries, 4096)
    assert len(text) <= 4096 and 0 < kept < 500
    assert decode_record(text, "a") == entries[-kept:]


@pytest.mark.parametrize("text, said", [
    ("not base64!", "not a decisions record"),
    (base64.b64encode(b"plain").decode(), "not a decisions record"),
    (base64.b64encode(zlib.compress(b'{"format": 9}')).decode(), "of format 9: this replica reads format 1"),
    (base64.b64encode(zlib.compress(b'{"format": 1, "fields": ["at"]}')).decode(), "without the fields"),
    (base64.b64encode(zlib.compress(json.dumps({"format": 1, "fields": ["at", "namespace", "kind", "name", "outcome",
     "gpus", "domain", "code", "reasons", "nodes"], "decisions": [[1, "ml", "Job", "j", "placed", "many", None, None,
     [], []]]}).encode())).decode(), "does not read"),
])
def test_a_record_that_is_not_ours_is_refused_with_what_is_wrong(text, said):
    with pytest.raises(ValueError, match=said):
        decode_record(text, "a")


def test_the_page_lists_every_replicas_decisions_and_names_who_made_the_latest():
    ours = RecentDecisions(size=4, replica="webhook-0")
    theirs = [decision(1, "webhook-1", name="train"), decision(5, "webhook-1", name="serve")]
    ours.share(lambda: theirs)
    ours.adopt([decision(2, "webhook-0", name="train"), decision(3, "webhook-0", name="eval"),
                decision(0, "webhook-0", name="old")])
    merged = ours.entries()
    assert [entry.at for entry in merged] == [1001.0, 1002.0, 1003.0, 1005.0]  # the newest 4, oldest first
    latest = latest_per_workload(merged, Selection())
    assert [(entry.name, entry.replica) for entry in latest] == [
        ("serve", "webhook-1"), ("eval", "webhook-0"), ("train", "webhook-0")]


def test_decisions_a_replica_recorded_before_a_restart_are_taken_back_before_its_new_ones():
    restarted = RecentDecisions(size=3, replica="a")
    restarted.adopt([decision(10)])  # decided since the start
    restarted.adopt([decision(i) for i in range(8)] + [decision(10)])
    assert [entry.at for entry in restarted.own()] == [1006.0, 1007.0, 1010.0]
