"""The decisions the topology page lists: this process's, kept in memory. An admission thread
records its decision here (a deque append under a lock: no API call on the admission path)."""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from ...admission import AdmissionOutcome, AdmissionResult

RECENT_DECISIONS = 500  # decisions kept for the page, newest last
NODES_PER_ENTRY = 64  # node names listed per decision or hold
_NOT_RECORDED = (AdmissionOutcome.IGNORED,)  # every pod of every template would crowd out the decisions


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
    """The last decisions of this process, bounded; admission threads record, the page reads."""

    def __init__(self, size: int = RECENT_DECISIONS, replica: str = ""):
        self.size = size
        self.replica = replica
        self._entries: deque[RecordedDecision] = deque(maxlen=size)
        self._lock = threading.Lock()

    def record(self, result: AdmissionResult, at: float) -> None:
        if result.outcome in _NOT_RECORDED:
            return
        entry = RecordedDecision.of(result, at, self.replica)
        with self._lock:
            self._entries.append(entry)

    def own(self) -> list[RecordedDecision]:
        """This replica's decisions, oldest first."""
        with self._lock:
            return list(self._entries)

    def entries(self) -> list[RecordedDecision]:
        return self.own()
