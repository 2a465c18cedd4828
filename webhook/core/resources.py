"""Resources other than GPUs, counted as kube-scheduler's NodeResourcesFit counts them.

GPUs are what placement optimises; every other resource a pod requests (cpu, memory,
ephemeral-storage, hugepages-*, other extended resources such as RDMA devices) and the node's
`pods` limit are a fit filter: a node that cannot take one more pod of the request is not used.
Quantities are whole numbers in the resource's base unit, cpu in millicores.
"""
from __future__ import annotations

import functools
import math
import re
from decimal import Decimal, InvalidOperation
from typing import Callable, Mapping

from .model import GPU_RESOURCE

PODS = "pods"  # the node's pod limit; every pod takes one
Vector = dict[str, int]

_SUFFIXES: dict[str, Decimal | int] = {"": 1, "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
             "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_QUANTITY = re.compile(r"([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")


@functools.lru_cache(maxsize=4096)  # pods repeat the same few quantities; parsing is the cost of an event
def quantity(value: str, resource: str) -> int:
    """A Kubernetes quantity in the resource's base unit (millicores for cpu), rounded up as the
    API rounds. Raises ValueError for text that is not a quantity."""
    match = _QUANTITY.fullmatch(str(value).strip())
    if match is None:
        raise ValueError(f"{value!r} is not a quantity")
    try:
        amount = Decimal(match.group(1)) * Decimal(_SUFFIXES[match.group(2) or ""])
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a quantity") from None
    if resource == "cpu":
        amount *= 1000
    return math.ceil(amount)


def _vector(entries: Mapping | None) -> Vector:
    """Parsed quantities, GPUs left out (counted apart); unreadable ones are skipped (the API
    validated them before we see them)."""
    out: Vector = {}
    for name, value in (entries or {}).items():
        if name == GPU_RESOURCE:
            continue
        try:
            out[str(name)] = quantity(str(value), str(name))
        except ValueError:
            continue
    return out


def _container(container: Mapping) -> Vector:
    """A container's requests; a resource with only a limit is requested at the limit (as the API
    defaults it)."""
    resources = container.get("resources") or {}
    return {**_vector(resources.get("limits")), **_vector(resources.get("requests"))}


def _add(into: Vector, more: Mapping[str, int]) -> None:
    for name, amount in more.items():
        into[name] = into.get(name, 0) + amount


def containers_total(pod_spec: Mapping, per_container: Callable[[Mapping], Mapping[str, int]]) -> Vector:
    """What a pod's containers take together, as kube-scheduler computes it: app and sidecar
    (restartable init) containers summed, or the largest plain init container where larger (per
    resource). The one place this arithmetic is written: GPUs (gpus.pod_gpus) and every other
    resource (pod_requests) are counted by it."""
    running: Vector = {}
    for container in pod_spec.get("containers") or ():
        _add(running, per_container(container))
    peak: Vector = {}
    for init in pod_spec.get("initContainers") or ():
        if init.get("restartPolicy") == "Always":
            _add(running, per_container(init))
        else:
            for name, amount in per_container(init).items():
                peak[name] = max(peak.get(name, 0), amount)
    return {name: max(running.get(name, 0), peak.get(name, 0)) for name in {*running, *peak}}


def pod_requests(pod_spec: Mapping) -> Vector:
    """What one pod takes from its node, GPUs aside: its containers (containers_total), plus the
    pod overhead, plus one of the node's pods."""
    total = containers_total(pod_spec, _container)
    _add(total, _vector(pod_spec.get("overhead")))
    total = {name: amount for name, amount in total.items() if amount > 0}
    total[PODS] = 1
    return total


def node_allocatable(status: Mapping) -> Vector:
    """A node's allocatable resources, GPUs left out."""
    return _vector(status.get("allocatable"))

