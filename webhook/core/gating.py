"""Waits held by our scheduling gate (`gate_waits`): the pending pods that carry it, by workload,
and which workloads are whole enough to be decided again.

A gated pod carries what the releaser needs to decide its workload again without the workload
object: its request as decided (`gated-request`), the domain it waits in (`waiting-for`) and its
reservation key. A workload is ready when all its pods exist: the gated ones, plus the bound ones
of a workload that is partly running already (a pod replaced after a failure is gated again by its
template, and is started alone). Pure: the index feeds it pods and the placer asks it for groups.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping

from .injection import GATE, GATED_REQUEST, RESERVATION, WAITING_FOR, loads_request, parse_domain_path
from .model import PlacementRequest


@dataclass(frozen=True)
class GatedPod:
    """One pending pod held by our gate, with the object as the live view last saw it (the
    releaser patches from it)."""

    key: str  # the pod's key in the index
    reservation: str
    request: PlacementRequest
    path: tuple[tuple[str, str], ...]  # the domain it waits in
    since: float  # when the index first saw it gated, by the index's clock
    pod: Mapping

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


def gated(pod: Mapping) -> tuple[str, PlacementRequest, tuple[tuple[str, str], ...]] | None:
    """(reservation, request, waited domain) of a pod our gate holds; None for any other pod,
    or one whose annotations do not say all three (the releaser cannot decide it: it stays gated,
    and is listed by `kubectl get pods` as SchedulingGated)."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or ()
    if not any(isinstance(g, Mapping) and g.get("name") == GATE for g in gates):
        return None
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    request = loads_request(annotations.get(GATED_REQUEST))
    path = parse_domain_path(annotations.get(WAITING_FOR))
    reservation = annotations.get(RESERVATION)
    if request is None or not path or not reservation or not (pod.get("metadata") or {}).get("name"):
        return None
    return str(reservation), request, path


class GatedPods:
    """The gated pods the index has seen, by pod key and by workload."""

    def __init__(self) -> None:
        self.pods: dict[str, GatedPod] = {}
        self.by_reservation: dict[str, dict[str, GatedPod]] = {}

    def __len__(self) -> int:
        return len(self.pods)

    def note(self, key: str, pod: Mapping | None, now: float) -> bool:
        """Keep `pod` if our gate holds it (it keeps when it was first seen), else forget it.
        Returns whether it is a gated pod not seen before (its workload may be whole now)."""
        found = gated(pod) if pod is not None else None
        if found is None or pod is None:
            self.forget(key)
            return False
        reservation, request, path = found
        seen = self.pods.get(key)
        since = seen.since if seen is not None and seen.reservation == reservation else now
        self.forget(key)
        entry = GatedPod(key, reservation, request, path, since, pod)
        self.pods[key] = entry
        self.by_reservation.setdefault(reservation, {})[key] = entry
        return seen is None

    def forget(self, key: str) -> None:
        entry = self.pods.pop(key, None)
        if entry is None:
            return
        group = self.by_reservation[entry.reservation]
        del group[key]
        if not group:
            del self.by_reservation[entry.reservation]

    def ready(self, running: Mapping[str, int]) -> list[GatedGroup]:
        """Workloads whose pods all exist, oldest first: `running` counts each reservation's bound
        pods. One whose gated pods disagree on the request or domain (two objects under one key)
        is decided as its first pod says."""
        groups = []
        for reservation, members in self.by_reservation.items():
            pods = sorted(members.values(), key=lambda p: p.name)
            first = pods[0]
            bound = running.get(reservation, 0)
            if len(pods) + bound < first.request.pods:
                continue  # its controller has not made every pod yet
            request = first.request if not bound else dataclasses.replace(first.request, pods=len(pods))
            pods = pods[:request.pods]  # never more than the request decided for
            groups.append(GatedGroup(reservation, request, first.path, tuple(pods)))
        groups.sort(key=lambda g: (min(p.since for p in g.pods), g.reservation))
        return groups
