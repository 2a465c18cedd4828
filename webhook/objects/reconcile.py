"""How every writer in webhook/objects/mutation.py changes pod templates: each template is taken
from what its record says we put there (webhook/core/injection.py) to what we want there now, item
by item (required and preferred node affinity expressions, spread constraints, env variables, the
workload label, the scheduling gate), by the rule mutation.py states. On a copy: the object given
is never changed.

The copy is made as it is written: the mappings and lists on the way down to each pod template,
the template, its metadata and annotations, its spec, the spec's affinity, its container lists and
the containers whose env we change are new; everything else (other containers, volumes,
resources, env items, the user's constraints) is the object's own, shared. A review's copy then
costs what we write, not the pod's size, and the patch finds the shared parts equal at once
(webhook/objects/patch.py). So the object returned may be changed in place only there.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import orjson

from ..core.injection import GATE, INJECTED, PREFERRED, REQUIRED_TERMS, WORKLOAD_LABEL, Injection, at
from ..settings.config import Config
from .limits import CONTAINER_LISTS
from .kinds import WorkloadKind
from .templates import pod_templates


def rewrite(obj: Mapping, kind: WorkloadKind, desired: Callable[[str, dict, dict, Injection], Injection],
            outputs: Callable[[str], Mapping[str, str | None]], config: Config | None) -> dict:
    """A copy of `obj` whose every pod template (by its path, `where`) is reconciled from what we
    recorded there to `desired(where, meta, spec, previous)`, with our output annotations set to
    `outputs(where)` (None removes) and, given a config, our scheduler name reset. A template
    without a pod spec has nothing of ours and is left as it is."""
    new = dict(obj)
    copies = {id(new)}
    for found in pod_templates(kind, new):  # the copy's way down, which is the object's until copied
        if not isinstance(found.template, dict) or not isinstance(found.template.get("spec"), dict):
            continue
        template = _copied_down(new, found.steps, copies)
        found_meta = template.get("metadata")
        meta: dict = dict(found_meta) if isinstance(found_meta, dict) else {}
        if isinstance(meta.get("annotations"), dict):
            meta["annotations"] = dict(meta["annotations"])
        had_metadata = bool(meta)
        spec = template["spec"] = _spec_copy(template["spec"])
        if config is not None and spec.get("schedulerName") in config.scheduler_names:
            spec["schedulerName"] = config.default_scheduler
        previous = Injection.loads(annotations_in(meta).get(INJECTED))
        owned = _apply(meta, spec, previous, desired(found.where, meta, spec, previous))
        set_annotations(meta, {**outputs(found.where), INJECTED: owned.dumps() if owned != Injection() else None})
        if meta or isinstance(found_meta, dict) and not had_metadata:  # an empty one the user wrote: the copy
            template["metadata"] = meta
        elif had_metadata:
            del template["metadata"]  # we emptied it: leave no trace
    return new


def _copied_down(root: dict, steps: tuple[str | int, ...], copies: set[int]) -> dict:
    """The node at `steps` under `root`, each mapping and list on the way there (it included) a
    copy put in its parent's place; `copies` holds the ids of those made already (templates share
    the way down from the object)."""
    node: Any = root
    for step in steps:
        child = node[step]
        if id(child) not in copies:
            child = dict(child) if isinstance(child, dict) else list(child)
            copies.add(id(child))
            node[step] = child
        node = child
    return node


def _spec_copy(spec: Mapping) -> dict:
    """A pod spec's copy new where the writers change it in place: itself, its affinity (whole:
    small, and reconciled term by term) and its container lists (a container is copied when its
    env changes: `_apply_env`)."""
    copy = dict(spec)
    if isinstance(copy.get("affinity"), dict):
        copy["affinity"] = copy_tree(copy["affinity"])
    for key in CONTAINER_LISTS:
        if isinstance(copy.get(key), list):
            copy[key] = list(copy[key])
    return copy


def _apply(meta: dict, spec: dict, previous: Injection, desired: Injection) -> Injection:
    """Reconcile the template from `previous` (ours, as recorded) to `desired`; returns what we now own."""
    required = _apply_required(spec, previous.required, desired.required)
    preferred_items, preferred_owned = _reconcile(
        at(spec, PREFERRED) or [], [previous.preferred] if previous.preferred else [],
        [desired.preferred] if desired.preferred else [], _canonical)
    put(spec, PREFERRED, preferred_items)
    label = _apply_label(meta, previous.label, desired.label)
    spread, spread_owned = _reconcile(spec.get("topologySpreadConstraints") or [], list(previous.spread),
                                      list(desired.spread), _spread_identity)
    put(spec, ("topologySpreadConstraints",), spread)
    gated = _apply_gate(spec, previous.gated, desired.gated)
    env = _apply_env(spec, previous.env, desired.env)
    return Injection(required, preferred_owned[0] if preferred_owned else None, tuple(spread_owned), env, label,
                     gated)


def _apply_env(spec: dict, previous: Mapping[str, Mapping[str, str]],
               desired: Mapping[str, Mapping[str, str]]) -> dict[str, dict[str, str]]:
    """Our env variables in the containers named in either record, each container copied into
    its list before its env changes (the others stay the object's own); returns what we now own."""
    named = previous.keys() | desired.keys()
    env = {}
    for key in CONTAINER_LISTS:
        listed = spec.get(key)
        if not (named and isinstance(listed, list)):
            continue
        for position, container in enumerate(listed):
            name = container.get("name") if isinstance(container, dict) else None
            if not isinstance(name, str) or name not in named:
                continue
            want = [{"name": k, "value": v} for k, v in desired.get(name, {}).items()]
            had = [{"name": k, "value": v} for k, v in previous.get(name, {}).items()]
            items, owned = _reconcile(container.get("env") or [], had, want, lambda e: e.get("name"))
            if (container.get("env") or []) != items:
                listed[position] = container = dict(container)
                put(container, ("env",), items)
            if owned:
                env[name] = {e["name"]: e["value"] for e in owned}
    return env


def _apply_gate(spec: dict, previous: bool, desired: bool) -> bool:
    """Our entry in spec.schedulingGates, added or removed in place; returns whether we own it
    now. An entry of that name we did not add (the record says so) is never ours to remove."""
    gates = list(spec.get("schedulingGates") or [])
    present = any(isinstance(g, dict) and g.get("name") == GATE for g in gates)
    if present and previous and not desired:
        gates = [g for g in gates if not (isinstance(g, dict) and g.get("name") == GATE)]
    elif desired and not present:
        gates.append({"name": GATE})
    put(spec, ("schedulingGates",), gates)
    return desired and (previous or not present)


def _apply_required(spec: dict, previous: tuple[tuple[dict, ...], ...],
                    desired: tuple[tuple[dict, ...], ...]) -> tuple[tuple[dict, ...], ...]:
    """Our expressions in every nodeSelectorTerm (terms are ORed), reconciled term by term with
    what the record says we put in that very term. An empty term `{}` matches no node, so it
    stays empty. Returns, per term, the expressions we now own there."""
    want = desired[0] if desired else ()
    terms = at(spec, REQUIRED_TERMS)
    if not terms:
        if not want:
            return ()
        put(spec, REQUIRED_TERMS, [{"matchExpressions": copy_tree(list(want))}])
        return (want,)
    owned: list[tuple[dict, ...]] = []
    kept = []
    for position, term in enumerate(terms):
        ours = previous[position] if position < len(previous) else ()
        if not isinstance(term, dict) or not (term.get("matchExpressions") or term.get("matchFields")):
            kept.append(term)  # matches no node: adding to it would make it match ours
            owned.append(())
            continue
        items, mine = _reconcile(term.get("matchExpressions") or [], list(ours), list(want), _canonical)
        if not items and not term.get("matchFields"):
            continue  # a term that held only our expressions was ours
        put(term, ("matchExpressions",), items)
        kept.append(term)
        owned.append(tuple(mine))
    put(spec, REQUIRED_TERMS, kept)
    return tuple(owned) if any(owned) else ()


def _apply_label(meta: dict, previous: str | None, desired: str | None) -> str | None:
    labels = meta.get("labels") or {}
    current = labels.get(WORKLOAD_LABEL)
    ours = current is not None and current == previous
    if current is not None and not ours:
        return None  # the user's label: the selector uses it as it is
    if desired is None:
        if ours:
            rest = {k: v for k, v in labels.items() if k != WORKLOAD_LABEL}
            if rest:
                meta["labels"] = rest
            else:
                meta.pop("labels", None)
        return None
    meta["labels"] = {**labels, WORKLOAD_LABEL: desired}
    return desired


def _reconcile(items: list, previous: list, desired: list, identity: Callable[[Any], Any]) -> tuple[list, list]:
    """Our `previous` items are replaced in place by the desired item of the same identity, or
    dropped; desired items whose identity is free are appended; other items are never touched.
    Returns (new items, the desired items that are now ours): the items themselves when we had
    none there and want none (the user's list is not walked: a tenant's can be 30,000 long)."""
    if not previous and not desired:
        return items, []
    leftover = list(previous)
    wanted = {identity(d): d for d in desired}
    out, owned = [], []
    for item in items:
        if item in leftover:
            leftover.remove(item)
            replacement = wanted.pop(identity(item), None)
            if replacement is not None:
                out.append(copy_tree(replacement))
                owned.append(replacement)
            continue
        out.append(item)
    taken = {identity(i) for i in out if isinstance(i, dict)}
    for key, item in wanted.items():
        if key not in taken:
            out.append(copy_tree(item))  # one item goes into several lists: never share it
            owned.append(item)
    return out, owned


def copy_tree(node: Any) -> Any:
    """A copy of a JSON-shaped tree: new dicts and lists, scalars shared (they are immutable).
    About a third of the cost of copy.deepcopy, and a review copies every object it mutates."""
    if isinstance(node, dict):
        return {key: copy_tree(value) for key, value in node.items()}
    if isinstance(node, list):
        return [copy_tree(item) for item in node]
    return node


def containers(spec: Mapping) -> list[dict]:
    return [c for key in CONTAINER_LISTS for c in spec.get(key) or () if isinstance(c, dict)]


def annotations_in(meta: Mapping) -> Mapping:
    return meta.get("annotations") or {}


def set_annotations(meta: dict, values: Mapping[str, str | None]) -> None:
    """Set (or, for None, remove) annotations, creating or dropping the map only when needed."""
    annotations = meta.get("annotations") or {}
    changed = False
    for key, value in values.items():
        if value is None and key in annotations:
            del annotations[key]
            changed = True
        elif value is not None and annotations.get(key) != value:
            annotations[key] = value
            changed = True
    if changed:
        if annotations:
            meta["annotations"] = annotations
        else:
            meta.pop("annotations", None)


def put(node: dict, path: tuple[str, ...], items: list) -> None:
    """Store a list at `path`, creating parents; an emptied list is removed with parents it leaves
    empty. Unchanged lists are left as they are, so a user's `env: []` stays."""
    if (at(node, path) or []) == items:
        return
    parents = [node]
    for key in path[:-1]:
        if not isinstance(parents[-1].get(key), dict):
            parents[-1][key] = {}
        parents.append(parents[-1][key])
    if items:
        parents[-1][path[-1]] = items
        return
    parents[-1].pop(path[-1], None)
    for depth in range(len(path) - 1, 0, -1):
        if parents[depth]:
            break
        parents[depth - 1].pop(path[depth - 1], None)


def _canonical(item: Any) -> bytes:
    """An item's identity: its JSON with keys sorted (orjson: a fifteenth of json's time)."""
    return orjson.dumps(item, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)


def _spread_identity(item: Mapping) -> tuple:
    return (item.get("topologyKey"), item.get("whenUnsatisfiable"))
