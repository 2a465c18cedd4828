"""Waits held by our scheduling gate (`gate_waits`): the pending pods that carry it, by workload,
and which workloads are whole enough to be decided again.

A gated pod carries what the releaser needs to decide its workload again without the workload
object: its request as decided (`gated-request`), the domain it waits in (`waiting-for`) and its
reservation key. Pods make one group by that key and, where the key names their controller (a
Job's), by that controller's uid too: a Job deleted and created again under its name starts a new
group, which the old one's pods (deleted later by the garbage collector) neither join nor shrink. A workload is ready when all its pods exist: the gated ones, plus the bound ones
of a workload that is partly running already (a pod replaced after a failure is gated again by its
template, and is started alone). Pure: the index feeds it pods and the placer asks it for groups.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Collection, Mapping

from ..core.injection import GateRecord
from ..core.model import PlacementRequest


@dataclass(frozen=True)
class GatedPod:
    """One pending pod held by our gate, with the object as the live view last saw it (the
    releaser patches from it)."""

    key: str  # the pod's key in the index
    reservation: str
    owner: str  # its controller's uid where the reservation names that controller, else ""
    request: PlacementRequest
    path: tuple[tuple[str, str], ...]  # the domain it waits in
    since: float  # when the index first saw it gated, by the index's clock
    pod: Mapping

    @property
    def group(self) -> str:
        """The group it is released with: its reservation, and its owner's uid where it has one."""
        return f"{self.reservation}@{self.owner}" if self.owner else self.reservation

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.pod["metadata"].get("namespace") or "")


@dataclass(frozen=True)
class GatedGroup:
    """A workload's gated pods (by name), with the request to decide for them."""

    reservation: str
    request: PlacementRequest  # for the gated pods only, when some of its pods already run
    path: tuple[tuple[str, str], ...]
    pods: tuple[GatedPod, ...]
    group: str  # its pods' group (GatedPod.group)
    # The key its release is held and claimed under: the workload's own, or, for pods that join a
    # workload part of which started already (a replacement, a scale-up), one of their own, so
    # that the hold of the part that started is not dropped.
    hold: str


class GatedPods:
    """The gated pods the index has seen, by pod key and by workload."""

    def __init__(self) -> None:
        self.pods: dict[str, GatedPod] = {}
        self.by_group: dict[str, dict[str, GatedPod]] = {}
        # Pods our gate holds whose record is not believed: key -> (the pod, why). Never decided;
        # the releaser reports each once.
        self.refused: dict[str, tuple[Mapping, str]] = {}
        # Gated pods deleted while gated, by workload: a Job scaled down deletes pods it had made,
        # so without its owner's word a workload waits for that many fewer.
        self.removed: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.pods)

    def waited(self, now: float) -> tuple[int, float]:
        """How many pods our gate holds, and how long the one held longest has waited."""
        return len(self.pods), max((now - pod.since for pod in self.pods.values()), default=0.0)

    def note(self, key: str, found: GateRecord | str | None, pod: Mapping, now: float) -> bool:
        """Keep `pod` if our gate holds it (`found`: its sealed record, or why that is not believed;
        None: not gated); it keeps when it was first seen. Else forget it. Returns whether it is a
        gated pod not seen before (its workload may be whole now)."""
        if isinstance(found, str):
            self.forget(key)
            self.refused[key] = (pod, found)
            return False
        if found is None:
            self.forget(key)
            return False
        seen = self.pods.get(key)
        entry = GatedPod(key, found.reservation, found.owner, found.request, found.path, now, pod)
        if seen is not None and seen.group == entry.group:
            entry = dataclasses.replace(entry, since=seen.since)
        self.forget(key)
        self.pods[key] = entry
        self.by_group.setdefault(entry.group, {})[key] = entry
        if seen is None and self.removed.get(entry.group):
            self.removed[entry.group] -= 1  # a replacement for a pod deleted while gated, not a new one
        return seen is None

    def forget(self, key: str) -> None:
        self.refused.pop(key, None)
        entry = self.pods.pop(key, None)
        if entry is None:
            return
        group = self.by_group[entry.group]
        del group[key]
        if not group:
            del self.by_group[entry.group]
            self.removed.pop(entry.group, None)

    def deleted(self, key: str) -> None:
        """A pod is gone from the API: one our gate held leaves its workload smaller."""
        entry = self.pods.get(key)
        if entry is not None and len(self.by_group[entry.group]) > 1:
            self.removed[entry.group] = self.removed.get(entry.group, 0) + 1
        self.forget(key)

    def unsure(self, running: Mapping[str, int]) -> dict[str, GatedPod]:
        """Groups whose pods exist in another number than their request says (scaled while gated,
        or not all made yet), with one of their pods: their owner says how many it wants."""
        unsure = {}
        for group, members in self.by_group.items():
            first = next(iter(members.values()))
            if len(members) + running.get(first.reservation, 0) != first.request.pods:
                unsure[group] = first
        return unsure

    def ready(self, running: Mapping[str, int], started: Collection[str] = (),
              sizes: Mapping[str, int] | None = None) -> list[GatedGroup]:
        """Groups whose pods all exist, oldest first. `running` counts each reservation's bound
        pods; `started`, pods released already (not bound yet: not decided again); `sizes`, how
        many pods a group's owner wants now (by group), where it differs from the request. Without the
        owner's word, what its pods say: more pods than the request were made (scaled up), or as
        many fewer as were deleted while gated (scaled down); else the request. One whose gated
        pods disagree on the request or domain (two objects under one key) is decided as its first
        pod says."""
        groups = []
        for group, members in self.by_group.items():
            pods = sorted((p for key, p in members.items() if key not in started), key=lambda p: p.name)
            if not pods:
                continue
            first = pods[0]
            reservation = first.reservation
            going = running.get(reservation, 0) + len(members) - len(pods)
            made = running.get(reservation, 0) + len(members)
            size = (sizes or {}).get(group, made if made > first.request.pods
                                     else first.request.pods - self.removed.get(group, 0))
            wanted = min(len(pods), size - going)
            if wanted <= 0 or len(pods) + going < size:
                continue  # its controller has not made every pod yet, or removes the ones left over
            request = first.request if wanted == first.request.pods else dataclasses.replace(first.request, pods=wanted)
            pods = pods[:wanted]  # never more than its owner wants
            hold = reservation if not going else f"{reservation}+{pods[0].name}"
            groups.append(GatedGroup(reservation, request, first.path, tuple(pods), group, hold))
        groups.sort(key=lambda g: (min(p.since for p in g.pods), g.reservation))
        return groups
