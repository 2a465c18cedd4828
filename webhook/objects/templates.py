"""Where an object of a kind we place keeps its pod templates, found; and the fields we use,
checked for their API types.

Pure: takes the object as the API sends it. Finding never raises (an object that is not ours may
be anything); `check_fields` raises InvalidWorkload naming the first field we use that does not
have its API type, so what reads or writes the object after it can take those types for granted.
"""
from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..core.model import MAPPINGS
from .kinds import ANY, Templates, WorkloadKind
from .user_annotations import InvalidWorkload

# The shape of the fields we read or write, as the API types them: the apiserver only sends
# objects that decode into these, but offline manifests are whatever a file holds. A list holds
# items of its one element's shape; `_STRINGS` is a map of strings; `_NAME` a string that must be
# there and not empty (the API requires it: we key containers by it); None (or absent) is unset.
_STRINGS = "a map of strings"
_NAME = "a non-empty string"
_EXPRESSION = {"key": str, "operator": str, "values": [str]}
_TERM = {"matchExpressions": [_EXPRESSION], "matchFields": [_EXPRESSION]}
_CONTAINER = {"name": _NAME, "env": [{"name": str}], "resources": {"limits": dict, "requests": dict}}
_TEMPLATE_SHAPE = {
    "metadata": {"annotations": _STRINGS, "labels": _STRINGS},
    "spec": {
        "containers": [_CONTAINER], "initContainers": [_CONTAINER], "nodeSelector": _STRINGS, "tolerations": [dict],
        "schedulerName": str, "nodeName": str, "topologySpreadConstraints": [{"topologyKey": str,
                                                                              "whenUnsatisfiable": str}],
        "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [_TERM]},
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": int, "preference": _TERM}]}},
    },
}


@dataclass(frozen=True)
class PodTemplate:
    """One pod template of an object, with the replica spec whose fields say how many pods it runs."""

    where: str  # "spec.template", "spec.replicatedJobs[0].template.spec.template" ("" for a Pod)
    template: Mapping | None  # metadata + spec; the object itself for a Pod; None if absent
    spec_of: Templates
    replica_spec: Mapping
    replica_where: str
    steps: tuple[str | int, ...] = ()  # the keys and list indices from the object down to the template


def pod_templates(kind: WorkloadKind, obj: Mapping) -> list[PodTemplate]:
    """Every pod template of `obj`, in the order of its kind's table (webhook/objects/kinds.py)."""
    found = []
    for spec_of in kind.templates:
        for replica_where, replica_steps, replica in _expand(obj, spec_of.replica_spec, ""):
            node, where = replica, replica_where
            for key in spec_of.template:
                node, where = node.get(key) if isinstance(node, MAPPINGS) else None, field_path(where, key)
            found.append(PodTemplate(where, node if isinstance(node, MAPPINGS) else None, spec_of,
                                     mapping_of(replica), replica_where, (*replica_steps, *spec_of.template)))
    return found


def pod_template(kind: WorkloadKind, obj: Mapping) -> Mapping | None:
    """The first pod template of `obj` (the only one, but for the operators' kinds, whose
    templates all carry the same placement); the object itself for a Pod; None if absent."""
    return next((t.template for t in pod_templates(kind, obj)), None)


def check_fields(kind: WorkloadKind, obj: Mapping, who: str) -> None:
    """Raise InvalidWorkload naming the first field we use that does not have its API type (the
    object's shape); `who`, a display name, starts the message."""
    _check(obj.get("metadata"), {"annotations": _STRINGS, "ownerReferences": [dict]}, "metadata", who)
    for spec_of in kind.templates:
        for where, _, replica in _expand(obj, spec_of.replica_spec, "", who):
            for found_where, _, template in _expand(replica, spec_of.template, where, who):
                _check(template, _TEMPLATE_SHAPE, found_where, who)


def display_name(kind: str, obj: Mapping, namespace: str) -> str:
    """`Job ml/train`, or `Pod ml/trainer-` for a generateName object."""
    meta = mapping_of(obj.get("metadata"))
    name = meta.get("name") or meta.get("generateName") or ""
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


def field_path(where: str, key: str) -> str:
    """The dotted path of `key` under `where` ("" is the object itself)."""
    return f"{where}.{key}" if where else key


def mapping_of(value: object) -> Mapping:
    return value if isinstance(value, MAPPINGS) else {}


def _expand(node: Any, path: tuple[str, ...], where: str, who: str | None = None,
            steps: tuple[str | int, ...] = ()) -> Iterator[tuple[str, tuple[str | int, ...], Any]]:
    """(dotted path, keys and indices taken, value) at `path` under `node`, ANY taking every entry;
    with `who`, raise InvalidWorkload where a step is not the container the path goes through."""
    if not path:
        yield where, steps, node
        return
    key, rest = path[0], path[1:]
    if key == ANY:
        if who is not None:
            _check(node, (list, dict), where, who)
        entries = enumerate(node) if isinstance(node, list) else node.items() if isinstance(node, MAPPINGS) else ()
        for name, entry in entries:
            yield from _expand(entry, rest, f"{where}[{name}]" if isinstance(node, list)
                               else field_path(where, str(name)), who, (*steps, name))
        return
    if who is not None:
        _check(node, dict, where, who)
    yield from _expand(node.get(key) if isinstance(node, MAPPINGS) else None, rest, field_path(where, key), who,
                       (*steps, key))


def _check(value: Any, shape: Any, path: str, who: str, item: bool = False) -> None:
    """`value` at `path` ("" is the object itself) has `shape`; a list item may not be null."""
    if value is None and not item and shape is not _NAME:
        return
    if shape is _STRINGS and isinstance(value, MAPPINGS):
        for key, entry in value.items():
            _check(entry, str, f"{path}.{key}", who, item=True)
        return
    if shape is _NAME:
        ok = isinstance(value, str) and value != ""
    elif isinstance(shape, list):
        ok = isinstance(value, list)
    elif isinstance(shape, dict) or shape in (dict, _STRINGS):
        ok = isinstance(value, MAPPINGS)
    else:
        ok = isinstance(value, shape) and not isinstance(value, bool)
    if not ok:
        expected = {list: "a list", dict: "a mapping", str: "a string", int: "an integer",
                    (list, dict): "a list or a mapping"}.get(
            list if isinstance(shape, list) else dict if isinstance(shape, dict) else shape, shape)
        found = (json.dumps(value)[:40] if value is None or isinstance(value, (str, int, float))
                 else f"a {type(value).__name__}")
        raise InvalidWorkload(f"{who}: {path or 'the object'} is {found}; expected {expected}")
    if isinstance(shape, list):
        if _all_fit(value, shape[0]):
            return
        for i, entry in enumerate(value):  # one does not: found by its path, and named
            _check(entry, shape[0], f"{path}[{i}]", who, item=True)
    elif isinstance(shape, dict):
        for key, sub in shape.items():
            _check(value.get(key), sub, f"{path}.{key}" if path else key, who)


def _all_fit(items: list, shape: Any) -> bool:
    """Whether every item of a list surely has `shape`, told without naming any: a mapping whose
    keys hold strings or integers, or are unset (an env variable, a spread constraint), or a
    mapping alone (a toleration), each as JSON decodes it (a dict of str and int). A tenant's list
    of 40,000 was most of a review, checked item by item with the path of each; a list that fits
    now costs a set of types per field. False sends the list through the walk item by item, which
    names the first that does not fit (and takes what JSON does not give, such as a subclass)."""
    mappings = {type(item) for item in items} <= {dict}
    if shape is dict or not mappings:
        return shape is dict and mappings
    if not (isinstance(shape, dict) and all(sub in (str, int) for sub in shape.values())):
        return False
    return all({type(item.get(key)) for item in items} <= {type(None), kind} for key, kind in shape.items())
