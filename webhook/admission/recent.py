"""Recent decisions, those the topology page lists (webhook/serving/page): this replica's, kept in
memory, and every other replica's, read from what each wrote (webhook/kube/shared_decisions.py).
Here, below both adapters, because both use them: the server records and draws, the API adapter
writes and reads the records.

An admission thread records its decision here (a deque append under a lock: no API call on the
admission path). With replicas sharing their records, a thread writes this replica's newest
decisions into a record of its own every few seconds, and every replica reads the others' from
their records: each page lists the same decisions, each naming the replica that made it. The
record's text is `encode_record`'s: JSON, compressed, base64, bounded in size.
"""
from __future__ import annotations

import base64
import json
import threading
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable

from .envelope import AdmissionOutcome, AdmissionResult

RECENT_DECISIONS = 500  # decisions kept for the page, newest last
NODES_PER_ENTRY = 64  # node names listed per decision or hold
RECORD_FORMAT = 1
_NOT_RECORDED = (AdmissionOutcome.IGNORED,)  # every pod of every template would crowd out the decisions
_FIELDS = ("at", "namespace", "kind", "name", "outcome", "gpus", "domain", "code", "reasons", "nodes")


@dataclass(frozen=True)
class RecordedDecision:
    """One admission the page lists: who, what was decided and why, by which replica; no part of
    the object."""

    at: float  # wall-clock seconds, to the millisecond
    namespace: str
    kind: str
    name: str
    outcome: str  # AdmissionResult.outcome
    gpus: int
    domain: str | None
    code: str | None
    reasons: tuple[str, ...]
    nodes: tuple[str, ...]  # nodes of a placed decision, at most NODES_PER_ENTRY
    replica: str = ""  # the replica that decided ("": this process, offline)

    @classmethod
    def of(cls, result: AdmissionResult, at: float, replica: str = "") -> "RecordedDecision":
        decision = result.decision
        denial = (result.review.get("response") or {}).get("status") or {}
        reasons = decision.reasons if decision is not None and decision.reasons else (
            (denial["message"],) if denial.get("message") else result.warnings)
        return cls(at=round(at, 3), namespace=result.namespace, kind=result.kind, name=result.name,
                   outcome=result.outcome, gpus=decision.request.total_gpus if decision is not None else 0,
                   domain=str(decision.scope) if decision is not None and decision.scope is not None else None,
                   code=decision.code if decision is not None else None,
                   reasons=tuple(reasons),
                   nodes=tuple(decision.nodes[:NODES_PER_ENTRY]) if decision is not None else (),
                   replica=replica)


class RecentDecisions:
    """The last decisions of this replica, bounded, and what the other replicas' records hold
    (`share`): admission threads record, the page and the record's writer read."""

    def __init__(self, size: int = RECENT_DECISIONS, replica: str = ""):
        self.size = size
        self.replica = replica
        self._entries: deque[RecordedDecision] = deque(maxlen=size)
        self._lock = threading.Lock()
        self.changes = 0  # decisions recorded so far: the writer writes when it moved
        self._others: Callable[[], Iterable[RecordedDecision]] = tuple

    def record(self, result: AdmissionResult, at: float) -> None:
        if result.outcome in _NOT_RECORDED:
            return
        entry = RecordedDecision.of(result, at, self.replica)
        with self._lock:
            self._entries.append(entry)
            self.changes += 1

    def own(self) -> list[RecordedDecision]:
        """This replica's decisions, oldest first."""
        with self._lock:
            return list(self._entries)

    def adopt(self, entries: Iterable[RecordedDecision]) -> None:
        """Take back what this replica's record held before a restart, older than what it decided since."""
        with self._lock:
            first = self._entries[0].at if self._entries else float("inf")
            older = sorted((entry for entry in entries if entry.at < first), key=lambda entry: entry.at)
            kept = older[max(0, len(older) + len(self._entries) - self.size):]
            self._entries.extendleft(reversed(kept))

    def share(self, others: Callable[[], Iterable[RecordedDecision]]) -> None:
        """Read the other replicas' decisions from `others` too (a thread-safe snapshot)."""
        self._others = others

    def entries(self) -> list[RecordedDecision]:
        """This replica's decisions and the others', the newest `size`, oldest first."""
        merged = self.own()
        merged.extend(self._others())
        merged.sort(key=lambda entry: entry.at)
        return merged[-self.size:]


def encode_record(entries: list[RecordedDecision], limit_bytes: int) -> tuple[str, int]:
    """The text of a record of `entries` (oldest first) and how many of them it holds: the newest
    that fit in `limit_bytes`. JSON, zlib-compressed, base64: a record of 500 decisions with
    their reasons is a few tens of KB, where the JSON alone is several hundred."""
    kept = len(entries)
    while True:
        rows = [[getattr(entry, field) for field in _FIELDS] for entry in entries[len(entries) - kept:]]
        raw = json.dumps({"format": RECORD_FORMAT, "fields": _FIELDS, "decisions": rows}, separators=(",", ":"))
        text = base64.b64encode(zlib.compress(raw.encode(), 6)).decode()
        if len(text) <= limit_bytes or kept == 0:
            return text, kept
        kept = min(kept - 1, int(kept * limit_bytes / len(text)))


def decode_record(text: str, replica: str) -> list[RecordedDecision]:
    """The decisions of a record `encode_record` wrote, as made by `replica`. Anything else (a
    record edited by hand, a newer format) raises ValueError saying what is wrong."""
    try:
        body = json.loads(zlib.decompress(base64.b64decode(text.encode(), validate=True)))
    except (ValueError, zlib.error) as err:
        raise ValueError(f"not a decisions record (base64 of zlib-compressed JSON): {err}") from None
    if not isinstance(body, dict) or body.get("format") != RECORD_FORMAT:
        raise ValueError(f"a decisions record of format {body.get('format') if isinstance(body, dict) else '?'!r}: "
                         f"this replica reads format {RECORD_FORMAT}")
    fields = body.get("fields")
    if not isinstance(fields, list) or set(_FIELDS) - set(fields):
        raise ValueError(f"a decisions record without the fields {', '.join(_FIELDS)}")
    out = []
    for row in body.get("decisions") or []:
        if not isinstance(row, list) or len(row) != len(fields):
            raise ValueError("a decision of the record is not a list of its fields")
        value = dict(zip(fields, row))
        try:
            out.append(RecordedDecision(
                at=float(value["at"]), namespace=str(value["namespace"]), kind=str(value["kind"]),
                name=str(value["name"]), outcome=str(value["outcome"]), gpus=int(value["gpus"]),
                domain=None if value["domain"] is None else str(value["domain"]),
                code=None if value["code"] is None else str(value["code"]),
                reasons=tuple(map(str, value["reasons"])), nodes=tuple(map(str, value["nodes"]))[:NODES_PER_ENTRY],
                replica=replica))
        except (TypeError, ValueError) as err:
            raise ValueError(f"a decision of the record does not read: {err}") from None
    return out
