"""GPU facts shared by discovery, the cluster view and the workload reader.

- The NVLink-domain notation of the node annotation `topology.scheduler/nvlink-domains`:
  domains are separated by `,`; a domain is a range `a-b`, a single index `a`, or several of
  those joined by `+` when its GPUs are not contiguous (`0+2,1+3` for two bridged pairs).
  GPUs in no domain have no NVLink peer. Example: `0-3,4-7` is two 4-GPU islands.
- GPU requests of a pod spec, as the scheduler counts them.
- Network bandwidth quantities such as `400Gb`.
"""
from __future__ import annotations

import functools
import re
from typing import Iterable, Mapping

from .model import GPU_RESOURCE
from .resources import containers_total

NVLINK_DOMAINS_ANNOTATION = "topology.scheduler/nvlink-domains"
# A whole number as Kubernetes writes one. Not `\d`, nor str.isdigit: Python's int() takes any
# script's digits (`٨`, `８`: 8; `²` it refuses), which no Kubernetes component reads as a number.
ASCII_DIGITS = r"[0-9]+"


@functools.lru_cache(maxsize=4096)  # every bound pod's GPU hint is parsed; few distinct strings exist
def parse_nvlink_domains(text: str) -> tuple[tuple[int, ...], ...]:
    """`0-3,4-7` -> ((0, 1, 2, 3), (4, 5, 6, 7)). Raises ValueError naming the bad part."""
    domains: list[tuple[int, ...]] = []
    seen: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        gpus: list[int] = []
        for piece in part.split("+"):
            match = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", piece)
            if not match:
                raise ValueError(f"{piece!r} is not a GPU index or range a-b")
            low = int(match.group(1))
            high = int(match.group(2)) if match.group(2) is not None else low
            if high < low:
                raise ValueError(f"range {piece!r} runs backwards")
            gpus.extend(range(low, high + 1))
        if seen.intersection(gpus):
            raise ValueError(f"GPU {sorted(seen.intersection(gpus))[0]} is in two NVLink domains")
        seen.update(gpus)
        domains.append(tuple(sorted(gpus)))
    return tuple(sorted(domains))


def parse_gpu_set(text: str) -> tuple[int, ...]:
    """`0-3+6` (format_gpu_set's output, or several domains) -> (0, 1, 2, 3, 6). Raises ValueError."""
    return tuple(i for domain in parse_nvlink_domains(text) for i in domain)


def format_gpu_set(gpus: Iterable[int]) -> str:
    """(0, 1, 2, 3, 6) -> `0-3+6`: ranges of one domain, joined by `+`."""
    ordered = sorted(set(gpus))
    runs: list[str] = []
    first = 0
    while first < len(ordered):
        last = first
        while last + 1 < len(ordered) and ordered[last + 1] == ordered[last] + 1:
            last += 1
        runs.append(str(ordered[first]) if first == last else f"{ordered[first]}-{ordered[last]}")
        first = last + 1
    return "+".join(runs)


def format_nvlink_domains(domains: Iterable[Iterable[int]]) -> str:
    """((0, 1, 2, 3), (4, 5, 6, 7)) -> `0-3,4-7`; single-GPU domains are left out (no NVLink)."""
    sets = sorted(tuple(sorted(d)) for d in domains if len(tuple(d)) > 1)
    return ",".join(format_gpu_set(d) for d in sets)


def nvlink_groups(domains: tuple[tuple[int, ...], ...], gpus: int) -> list[tuple[int, ...]]:
    """Every GPU index of a node of `gpus` in exactly one group: its NVLink domains plus
    singletons for the rest."""
    listed = {i for d in domains for i in d}
    return list(domains) + [(i,) for i in range(gpus) if i not in listed]


def pick_aligned(domains: tuple[tuple[int, ...], ...], gpus: int, count: int, taken: set[int]) -> tuple[int, ...]:
    """`count` GPUs NVLink-aligned among those not `taken`: the smallest group that holds them
    (best fit), else the fullest groups first, so a pod spans as few NVLink domains as possible."""
    groups = [[i for i in g if i not in taken and i < gpus] for g in nvlink_groups(domains, gpus)]
    groups = [g for g in groups if g]
    fitting = [g for g in groups if len(g) >= count]
    if fitting:
        return tuple(min(fitting, key=lambda g: (len(g), g[0]))[:count])
    chosen: list[int] = []
    for group in sorted(groups, key=lambda g: (-len(g), g[0])):
        chosen.extend(group[: count - len(chosen)])
        if len(chosen) == count:
            break
    return tuple(sorted(chosen))


def quantity_to_int(value: object) -> int:
    """An integer resource quantity (`"8"`, `8`); extended resources cannot be fractional."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a whole number")
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if not re.fullmatch(ASCII_DIGITS, text):
        raise ValueError(f"{value!r} is not a whole number")
    return int(text)


def container_gpus(container: Mapping) -> int:
    """GPUs one container asks for: limits win (extended resources must have limit == request)."""
    resources = container.get("resources") or {}
    for key in ("limits", "requests"):
        amount = (resources.get(key) or {}).get(GPU_RESOURCE)
        if amount is not None:
            return quantity_to_int(amount)
    return 0


def pod_gpus(pod_spec: Mapping) -> int:
    """GPUs a pod holds on its node, as kube-scheduler counts it (resources.containers_total)."""
    return containers_total(pod_spec, _gpus_of).get(GPU_RESOURCE, 0)


def _gpus_of(container: Mapping) -> dict[str, int]:
    return {GPU_RESOURCE: container_gpus(container)}


_BANDWIDTH = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(b|bps|B|Bps)?(?:/s)?", re.IGNORECASE)
_SCALE = {"": 1e-9, "k": 1e-6, "m": 1e-3, "g": 1.0, "t": 1e3}


# What a bandwidth in bits per second may be written as (the annotation's message names them).
BANDWIDTH_UNITS = "Kb, Mb, Gb or Tb, optionally followed by ps or /s (Gbps, Gb/s), or K, M, G or T alone"


class BandwidthInBytes(ValueError):
    """A bandwidth written in bytes per second (`50GB`, `50GBps`) where only bits are taken."""


def parse_bandwidth_gbps(text: str, bits_only: bool = False) -> float:
    """`400Gb`, `400G`, `100Gbps`, `1.6Tb`, `25Gb/s` -> Gb/s; a capital `B` is bytes: `50GB` is
    400 Gb/s, or BandwidthInBytes with `bits_only` (links are rated in bits: `200GB` written for a
    200 Gb link would ask for eight times that). Raises ValueError."""
    match = _BANDWIDTH.fullmatch(str(text).strip())
    if not match or (match.group(2) == "" and match.group(3) is None):
        raise ValueError(f"{text!r} is not a bandwidth such as 200Gb, 400Gbps or 1.6Tb")
    number, prefix, unit = float(match.group(1)), match.group(2).lower(), match.group(3) or "b"
    gbps = number * _SCALE[prefix]
    if unit.startswith("B"):
        if bits_only:
            raise BandwidthInBytes(f"{text!r} is in bytes per second ({gbps * 8:g} Gb/s)")
        return gbps * 8
    return gbps
