"""The object under admission, read once: its pod templates found at the first question asked,
and every answer admission asks for (ours? suspended? bound to a node? placed by us already?
which group? which reservation key?) derived from them once and kept.

Pure: the object is never changed. The old object of an UPDATE is a Subject of its own, read only
when asked. The fields we use are checked for their API types once (`check`); reading the request
(webhook/objects/workload.py) relies on that check, and does it only where it was not done.
"""
from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Any

import orjson

from ..core import injection
from ..core.injection import RESERVATION
from ..core.model import ANNOTATION_PREFIX, MAPPINGS
from ..settings.config import Config
from ..state.holds import reservation_key
from . import groups
from .groups import InvalidGroup, Membership
from .kinds import WorkloadKind, kind_of
from .limits import check_counts
from .templates import PodTemplate, check_fields, display_name, mapping_of, pod_templates
from .user_annotations import (KUEUE_PREFIX, KUEUE_QUEUE_NAME, KUEUE_TOPOLOGY, PEER_PREFERRED, PEER_REQUIRED,
                               InvalidAnnotation, InvalidWorkload)

# Objects of the kinds we handle nest about 20 levels at most (managedFields included); far deeper
# would exhaust Python's recursion in copying and diffing, so it is refused up front.
MAX_DEPTH = 100
# Specs that passed both checks, by kind and JSON text (`Subject.check`); only passes are kept,
# forgotten wholesale past the limit.
_PASSED_SPECS: set[tuple[str, bytes]] = set()
_PASSED_SPECS_LIMIT = 1024
_MOST_NODES_ASKED = 10_000  # maps and lists an object of an unknown kind is searched for our annotations
_PLAIN_JSON_ONLY = (orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS
                    | orjson.OPT_PASSTHROUGH_DATACLASS)


class Subject:
    """One object of `kind` (API group `api_group`) admitted in `namespace`, and `old`: the stored
    object an UPDATE replaces, None otherwise."""

    def __init__(self, kind: str, api_group: str, obj: Mapping, namespace: str, old: Mapping | None = None) -> None:
        self.kind, self.api_group, self.obj, self.namespace = kind, api_group, obj, namespace
        self.workload_kind: WorkloadKind | None = kind_of(api_group, kind)  # None: not a kind we place
        self.old = Subject(kind, api_group, old, namespace) if old is not None else None
        self._shape_checked = False

    @property
    def supported(self) -> bool:
        return self.workload_kind is not None

    @property
    def placed_kind(self) -> WorkloadKind:
        """Its kind in our table; asked of a kind we place only."""
        assert self.workload_kind is not None, "asked of a kind we place only (admit checks `ours` first)"
        return self.workload_kind

    @property
    def key(self) -> str:
        """How reservation keys and messages name its kind (webhook/objects/kinds.py)."""
        return self.workload_kind.key if self.workload_kind is not None else self.kind

    @cached_property
    def templates(self) -> tuple[PodTemplate, ...]:
        """Its pod templates, in its kind's order (webhook/objects/kinds.py); none for a kind we do not place."""
        return tuple(pod_templates(self.workload_kind, self.obj)) if self.workload_kind is not None else ()

    @property
    def template(self) -> Mapping | None:
        """The first pod template: the only one, but for the operators' kinds, whose templates all
        carry the same placement; the object itself for a Pod; None if absent."""
        return self.templates[0].template if self.templates else None

    @cached_property
    def who(self) -> str:
        return display_name(self.key, self.obj, self.namespace)

    @cached_property
    def annotations(self) -> Mapping[str, str]:
        """Annotations of the pod templates overlaid with the object's own (the object's win)."""
        merged: dict[str, str] = {}
        for found in self.templates:
            merged.update(mapping_of(_meta(found.template).get("annotations")))
        merged.update(mapping_of(_meta(self.obj).get("annotations")))
        return merged

    def ours(self, config: Config) -> bool:
        """A kind we place whose object or template carries a topology.scheduler/ annotation or names
        one of our scheduler names."""
        if not self.supported:
            return False
        if any(str(key).startswith(ANNOTATION_PREFIX) or key in PEER_REQUIRED + PEER_PREFERRED
               for key in self.annotations):
            return True
        return any(_spec(found).get("schedulerName") in config.scheduler_names for found in self.templates)

    @property
    def asks_for_placement(self) -> bool:
        """Whether any `annotations` map in it, its own or a pod template's wherever its kind keeps
        them, holds a topology.scheduler/ key (asked of an object of a kind we do not place, whose
        templates we cannot find; the walk is bounded by what it visits)."""
        stack: list[object] = [self.obj]
        visited = 0
        while stack and visited < _MOST_NODES_ASKED:
            node = stack.pop()
            visited += 1
            if isinstance(node, MAPPINGS):
                found = node.get("annotations")
                if isinstance(found, MAPPINGS) and any(str(key).startswith(ANNOTATION_PREFIX) for key in found):
                    return True
                stack.extend(value for value in node.values() if isinstance(value, (dict, list)))
            elif isinstance(node, list):
                stack.extend(value for value in node if isinstance(value, (dict, list)))
        return False

    def managed_elsewhere(self, config: Config) -> str | None:
        """Who places it when another queue or scheduler does, else None. Kueue places a pod it
        queues (its queue label, or a gate of Kueue's) and any workload of a queue that asks for
        its topology-aware scheduling; the scheduler its pods name, when that is neither ours nor
        the one we hand pods to (KAI's, say), places them. A Kueue workload that asks only for our
        placement is ours, placed when Kueue un-suspends it."""
        meta = _meta(self.obj)
        queued = KUEUE_QUEUE_NAME in mapping_of(meta.get("labels")) or KUEUE_QUEUE_NAME in mapping_of(
            meta.get("annotations"))
        named = [_at(self.obj, self.workload_kind.scheduler)] if self.workload_kind and self.workload_kind.scheduler else []
        for found in self.templates:
            spec = _spec(found)
            named.append(spec.get("schedulerName"))
            gates = spec.get("schedulingGates")
            if isinstance(gates, list) and any(isinstance(g, MAPPINGS) and str(g.get("name")).startswith(KUEUE_PREFIX)
                                               for g in gates):
                return "Kueue"
        for scheduler in named:
            if scheduler and scheduler != config.default_scheduler and scheduler not in config.scheduler_names:
                return f"scheduler {scheduler}"
        if queued and (self.kind == "Pod" or any(KUEUE_TOPOLOGY.fullmatch(str(k)) for k in self.annotations)):
            return "Kueue"
        return None

    @cached_property
    def suspended(self) -> bool:
        """Suspended (`spec.suspend: true`, or its kind's equivalent): a queue admits it later."""
        path = self.workload_kind.suspend if self.workload_kind is not None else None
        return path is not None and _at(self.obj, path) is True

    @property
    def started(self) -> bool:
        """A Job that has run pods since it was last suspended (`status.startTime`, reset by the
        Job controller at a suspension) or runs some now: the apiserver keeps its pod template as
        it is, even while it is suspended."""
        status = mapping_of(self.obj.get("status"))
        return self.key == "Job" and bool(status.get("startTime") or status.get("active"))

    @cached_property
    def controllers(self) -> tuple[Mapping, ...]:
        """Its owner references that are its controller (a Job, ReplicaSet, StatefulSet...)."""
        owners = _meta(self.obj).get("ownerReferences") or ()
        return tuple(o for o in owners if isinstance(o, MAPPINGS) and o.get("controller") is True) \
            if isinstance(owners, list) else ()

    @property
    def controller_owned(self) -> bool:
        """Made by a controller from a template, not by a user."""
        return bool(self.controllers)

    @cached_property
    def placed(self) -> bool:
        """Its pod template carries our placement, whole (webhook/core/injection.py)."""
        return injection.already_placed(self.template)

    @property
    def written_key(self) -> str | None:
        """The reservation key written on its pod template when it was placed."""
        return injection.reservation_of(self.template)

    @cached_property
    def bound(self) -> bool:
        """A pod spec names its node (spec.nodeName): kube-scheduler never sees it."""
        return any(_spec(found).get("nodeName") for found in self.templates)

    @property
    def made_for_group(self) -> bool:
        """An operator's object (not a Pod) whose pods are placed as members of their groups."""
        labels = {**mapping_of(_meta(self.template).get("labels")), **mapping_of(_meta(self.obj).get("labels"))}
        return self.kind != "Pod" and groups.made_for_group(labels)

    def membership(self, annotations: Mapping) -> Membership | None:
        """The group a Pod, or a Job an operator made (a JobSet's), belongs to under `annotations`
        (webhook/objects/groups.py); other kinds are placed as themselves. Raises InvalidAnnotation."""
        if self.key not in ("Pod", "Job"):
            return None
        try:
            return groups.membership(self.obj, self.namespace, mapping_of(_meta(self.template).get("labels")),
                                     annotations)
        except InvalidGroup as err:
            raise InvalidAnnotation(f"{self.who}: {err}") from None

    @cached_property
    def group(self) -> Membership | None:
        """The group it belongs to by its own annotations; None for a bad group annotation (which
        reading its request denies with its message)."""
        try:
            return self.membership(self.annotations)
        except InvalidAnnotation:
            return None

    def reservation_key(self, uid: str) -> str:
        """namespace/kind/name; a generateName object keeps the key already written on it (a second
        call has a new request `uid`) when that key can be its own, else gets generateName + uid.

        The annotation is client input: a key of another namespace, kind or owner would let this
        object replace (and so release) someone else's hold. Only these are taken: this object's own
        key (namespace/kind/generateName...), or the key of a workload that controls it in its
        namespace (a Job's pods carry the Job's key)."""
        if self.group is not None:
            return self.group.key  # a group's pods hold, and confirm, under the group's one key
        meta = _meta(self.obj)
        if meta.get("name"):
            return reservation_key(self.namespace, self.key, meta["name"])
        generate_name = str(meta.get("generateName") or "")
        written = str(self.annotations.get(RESERVATION) or "")
        owners = [reservation_key(self.namespace, str(o.get("kind")), str(o.get("name"))) for o in self.controllers]
        if written and (written.startswith(reservation_key(self.namespace, self.key, generate_name))
                        or written in owners):
            return written
        return reservation_key(self.namespace, self.key, f"{generate_name}{uid}")

    def check(self) -> None:
        """Raise InvalidWorkload for an object with more containers or node terms than a review
        takes on (webhook/objects/limits.py: counted first, before anything walks them), nested
        more than MAX_DEPTH levels deep, or naming the first field we use that does not have its
        API type.

        A spec that passed once for this kind passes again: both checks walk the whole object (most
        of a production pod's review, a spec of 11 KB), while pods made from one template, or copies
        of one manifest, differ outside it (names, uids, labels). Every template of our kinds is
        the spec or under it, and neither check of the spec reads anything outside it, so only the
        rest is checked then."""
        check_counts(self.templates, self.who)
        known = _spec_text(self.key, self.obj)
        if known is not None and known in _PASSED_SPECS:
            outside = {**self.obj, "spec": None}
            self._check_depth(outside)
            check_fields(self.placed_kind, outside, self.who)
            self._shape_checked = True
            return
        self._check_depth(self.obj)
        self.check_shape()
        if known is not None:
            if len(_PASSED_SPECS) >= _PASSED_SPECS_LIMIT:
                _PASSED_SPECS.clear()
            _PASSED_SPECS.add(known)

    def _check_depth(self, obj: Mapping) -> None:
        if _deeper_than(obj, MAX_DEPTH):
            raise InvalidWorkload(f"{self.who}: the object is nested more than {MAX_DEPTH} levels deep; "
                                  f"allowed: at most {MAX_DEPTH} levels")

    def check_shape(self) -> None:
        """Raise InvalidWorkload naming the first field we use that does not have its API type;
        checked once, whoever asks first."""
        if not self._shape_checked:
            check_fields(self.placed_kind, self.obj, self.who)
            self._shape_checked = True

    def as_written(self, obj: Mapping) -> Subject:
        """This subject as `obj`, its object with our earlier additions removed (what the user wrote:
        webhook/objects/mutation.py's `without_injection`). Removing items leaves every field its
        type, so a checked shape stays checked."""
        written = Subject(self.kind, self.api_group, obj, self.namespace)
        written._shape_checked = self._shape_checked
        return written


def _meta(node: Mapping | None) -> Mapping:
    return mapping_of((node or {}).get("metadata"))


def _at(node: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        node = mapping_of(node).get(key)
    return node


def _spec(found: PodTemplate) -> Mapping:
    return mapping_of((found.template or {}).get("spec"))


def _spec_text(kind: str, obj: Mapping) -> tuple[str, bytes] | None:
    """The key a spec's checks are remembered by: the kind and the spec as JSON. None for a spec
    holding anything but what JSON decodes to (a date or a number as a key, as YAML loads them; a
    subclass): its text could be another value's, and the type is what the check reads."""
    try:
        return kind, orjson.dumps(obj.get("spec"), option=_PLAIN_JSON_ONLY)
    except TypeError:  # orjson.JSONEncodeError too: a type it passes through, or nested past 255
        return None


def _deeper_than(obj: object, limit: int) -> bool:
    """Whether any value in `obj` sits more than `limit` containers deep: level by level, each
    level's mappings and lists gathered in one comprehension (iterative, so the check does not
    itself recurse; and about three times as fast as a stack of (node, depth) pairs)."""
    level = [obj] if isinstance(obj, (dict, list)) else []
    for _ in range(limit):
        level = [child for node in level for child in (node.values() if isinstance(node, dict) else node)
                 if isinstance(child, (dict, list))]
        if not level:
            return False
    return True
