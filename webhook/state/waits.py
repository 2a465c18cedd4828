"""The pending pods of pinned waits, as the cluster index sees them: what protection (placement's
protection.py) keeps free GPUs for."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Waiter:
    """One pending pod of a pinned wait."""

    key: str  # the reservation key of its workload (its own requests are never kept off its GPUs)
    path: tuple[tuple[str, str], ...]  # the domain it waits in
    gpus: int
    since: float  # when the index first saw it waiting, by the index's clock



class _Group:
    """The waiting pods of one workload in one domain: earliest and latest time seen, GPUs."""

    def __init__(self) -> None:
        self.pods: dict[str, Waiter] = {}
        self.first = self.last = 0.0
        self.gpus = 0

    def recount(self) -> None:
        times = [waiter.since for waiter in self.pods.values()]
        self.first, self.last = min(times), max(times)
        self.gpus = sum(waiter.gpus for waiter in self.pods.values())


class Waiting:
    """The pending pods of pinned waits by pod key, also grouped by workload and domain, so that
    `needs` takes a step per waiting workload rather than per pod (a 256-GPU job waits with 32)."""

    def __init__(self) -> None:
        self.pods: dict[str, Waiter] = {}
        self.groups: dict[tuple[str, tuple], _Group] = {}

    def __len__(self) -> int:
        return len(self.pods)

    def get(self, pod: str) -> Waiter | None:
        return self.pods.get(pod)

    def waited(self, key: str, now: float) -> float:
        """How long the workload `key` has waited, by its pod seen waiting first (0: none waits)."""
        return max((now - group.first for (of, _), group in self.groups.items() if of == key), default=0.0)

    def put(self, pod: str, waiter: Waiter) -> None:
        self.forget(pod)
        self.pods[pod] = waiter
        group = self.groups.setdefault((waiter.key, waiter.path), _Group())
        group.pods[pod] = waiter
        group.recount()

    def forget(self, pod: str) -> None:
        waiter = self.pods.pop(pod, None)
        if waiter is None:
            return
        group = self.groups[waiter.key, waiter.path]
        del group.pods[pod]
        if group.pods:
            group.recount()
        else:
            del self.groups[waiter.key, waiter.path]
