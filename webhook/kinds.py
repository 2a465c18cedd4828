"""The workload kinds the webhook handles, in one table: where each keeps its pod template, which
admission operations it is placed on, who places it and whether it holds GPUs once placed."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class WorkloadKind:
    name: str
    group: str  # API group ("" is the core group)
    template_path: tuple[str, ...]  # where the pod template is (() is the Pod itself)
    # Operations we place on. Pods are immutable after CREATE, and a Job's template too, so an
    # UPDATE patch would be rejected; on UPDATE the others keep the placement made at creation.
    operations: tuple[str, ...]
    # Made by a controller from a template we placed, it is that workload's own pod (or
    # ReplicaSet): placing it again would book the same GPUs twice. A Job made by a CronJob is
    # placed afresh: the CronJob's placement dates from its creation, not from this run.
    placed_by_owner: bool
    # Holds GPUs once placed. A CronJob's pods start on the schedule, not now: its Jobs hold when
    # they are created.
    reserves: bool


KINDS: Mapping[str, WorkloadKind] = {kind.name: kind for kind in (
    WorkloadKind("Pod", "", (), ("CREATE",), placed_by_owner=True, reserves=True),
    WorkloadKind("Job", "batch", ("spec", "template"), ("CREATE",), placed_by_owner=False, reserves=True),
    WorkloadKind("CronJob", "batch", ("spec", "jobTemplate", "spec", "template"), ("CREATE", "UPDATE"),
                 placed_by_owner=False, reserves=False),
    WorkloadKind("Deployment", "apps", ("spec", "template"), ("CREATE", "UPDATE"), placed_by_owner=False,
                 reserves=True),
    WorkloadKind("StatefulSet", "apps", ("spec", "template"), ("CREATE", "UPDATE"), placed_by_owner=False,
                 reserves=True),
    WorkloadKind("ReplicaSet", "apps", ("spec", "template"), ("CREATE", "UPDATE"), placed_by_owner=True,
                 reserves=True),
)}
