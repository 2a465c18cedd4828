"""A placed workload after its creation: an UPDATE keeps the placement made at creation. (What it
holds is freed by the watch, never by a review: state/holds.py.)"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..objects import mutation, workload
from ..objects.subject import Subject
from ..objects.user_annotations import InvalidWorkload
from ..settings.config import Config
from .envelope import AdmissionOutcome, AdmissionResult, Request, answer

if TYPE_CHECKING:
    from ..state.index import ClusterIndex


def kept(request: Request, subject: Subject, index: "ClusterIndex", config: Config, wanted: workload.Workload
         ) -> AdmissionResult:
    """An UPDATE of a workload we placed (`subject.old`): put our placement back, never move running
    work. If what it asks for changed, say so: re-placing would roll every pod."""
    old = subject.old
    assert old is not None, "an UPDATE of a placed workload carries its old object (admit checked)"
    warnings = list(wanted.warnings)
    try:
        before = workload.read(mutation.without_injection(old), index).request
    except InvalidWorkload:
        before = None
    if before != wanted.request:
        warnings.append(f"{subject.who}: placement inputs changed; "
                        "the placement made at creation is kept (recreate the workload to place it again)")
    mutated = mutation.carry_over(old, subject.obj, config)
    return answer(request, AdmissionOutcome.IGNORED, mutated=mutated, warnings=warnings)
