"""The `topology.scheduler/*` annotations a user writes (and the peers' topology annotations we read
as ours), and what each accepts: every parser takes the raw value and returns it typed, or raises
InvalidAnnotation naming the annotation, the value and what is allowed. Pure."""
from __future__ import annotations

import difflib
import re
from collections.abc import Mapping

from ..core.gpus import ASCII_DIGITS, BANDWIDTH_UNITS, BandwidthInBytes, parse_bandwidth_gbps
from ..core.injection import ADMISSION, OUTPUT_ANNOTATIONS
from ..core.model import ANNOTATION_PREFIX, Strategy, quoted
from ..core.strategies import DEFAULT as DEFAULT_STRATEGY, REGISTRY as STRATEGIES
from .groups import GROUP_ANNOTATIONS

# The comment above each annotation of INPUT_ANNOTATIONS, "what it takes. Default: ...", is its
# row in docs/reference/annotations.md (.ci/reference_docs.py writes it from here).

# Total GPUs of the workload, a positive integer. Default: derived from container
# `nvidia.com/gpu` limits x replicas/parallelism.
GPU_COUNT = ANNOTATION_PREFIX + "gpu-count"
# One of the [strategies](#strategies) below. Default: `balanced`.
STRATEGY = ANNOTATION_PREFIX + "placement-strategy"
# `true`, `false`. Default: `false`.
LATENCY_SENSITIVE = ANNOTATION_PREFIX + "latency-sensitive"
# A label value at any level (`leaf-1`), or `LEVEL=VALUE`. Default: none.
PREFERRED_DOMAIN = ANNOTATION_PREFIX + "preferred-domain"
# Minimum node bandwidth in bits per second, e.g. `200Gb`, `400Gbps`, `25Gb/s`, `1.6Tb` (`Kb`,
# `Mb`, `Gb`, `Tb`, optionally with `ps` or `/s`; `G` alone is Gb). A capital `B` is bytes and is
# refused (`200GB` would ask for 1600 Gb/s): the workload is denied, as for any invalid
# annotation. Nodes qualify by their label of the same key, read alike except that a byte unit
# there counts eight bits per byte. Default: none.
NETWORK_BANDWIDTH = ANNOTATION_PREFIX + "network-bandwidth"
# A level name (`leaf`, `spine`, `zone`, `node`) or its label key: never span wider; wait rather
# than spill (always a required affinity). Default: none.
MAX_DOMAIN = ANNOTATION_PREFIX + "max-domain"
# On a ResourceClaimTemplate: `pcie` (one GPU and one NIC on one PCIe root) or `numa` (the claim
# on one NUMA node), written as a constraint at its CREATE ([DRA](docs/dra.md); webhook/objects/alignment.py).
# Default: none.
ALIGN = ANNOTATION_PREFIX + "align"
INPUT_ANNOTATIONS = (GPU_COUNT, STRATEGY, LATENCY_SENSITIVE, PREFERRED_DOMAIN, NETWORK_BANDWIDTH, MAX_DOMAIN, ALIGN
                     ) + GROUP_ANNOTATIONS
# The peers' annotations, read as ours so a workload written for them works unchanged: a required
# level is consolidated and never wider than that level (max-domain); a preferred one is balanced.
PEER_REQUIRED = ("kueue.x-k8s.io/podset-required-topology", "kai.scheduler/topology-required-placement")
PEER_PREFERRED = ("kueue.x-k8s.io/podset-preferred-topology", "kai.scheduler/topology-preferred-placement")
# Kueue's own: a workload with its queue label is queued by Kueue (a pod Kueue queues waits behind a
# gate of Kueue's, and its topology-aware scheduling places a workload that names a level for it)
KUEUE_QUEUE_NAME = "kueue.x-k8s.io/queue-name"
KUEUE_PREFIX = "kueue.x-k8s.io/"
KUEUE_TOPOLOGY = re.compile(r"kueue\.x-k8s\.io/podset-(?:[a-z]+-)*topology")  # required, preferred, slice-required...
MAX_GPU_COUNT_DIGITS = 7  # ten million GPUs: beyond any cluster, and far below Python's int parsing limit

_BOOLEANS = {"true": True, "false": False}


class InvalidWorkload(ValueError):
    """The object cannot be placed as written; the message names the object, the field, the bad
    value and what is allowed. The admission step denies the request with it."""


class InvalidAnnotation(InvalidWorkload):
    """A `topology.scheduler/*` annotation has a value we do not accept."""


def unknown_annotations(who: str, annotations: Mapping) -> list[str]:
    """A warning for each topology.scheduler/ key we neither read nor write: a typo is otherwise
    silently ignored."""
    known = (*INPUT_ANNOTATIONS, *OUTPUT_ANNOTATIONS, ADMISSION)
    warnings = []
    for key in sorted(str(k) for k in annotations if str(k).startswith(ANNOTATION_PREFIX) and k not in known):
        guess = difflib.get_close_matches(key, INPUT_ANNOTATIONS, n=1, cutoff=0.8)
        hint = f"did you mean {guess[0]}?" if guess else \
            f"known: {', '.join(k.removeprefix(ANNOTATION_PREFIX) for k in INPUT_ANNOTATIONS)}"
        warnings.append(f"{who}: annotation {quoted(key)[1:-1]} is not one of ours and is ignored; {hint}")
    return warnings


def gpu_count(who: str, value: object) -> int:
    text = str(value).strip()
    if re.fullmatch(ASCII_DIGITS, text) and len(text.lstrip("0")) > MAX_GPU_COUNT_DIGITS:
        raise InvalidAnnotation(f"{who}: annotation {GPU_COUNT}={quoted(value)} ({len(text)} digits) is not allowed; "
                                f"allowed: a whole number of GPUs from 1 to {10 ** MAX_GPU_COUNT_DIGITS - 1}")
    if not re.fullmatch(ASCII_DIGITS, text) or int(text) <= 0:
        raise InvalidAnnotation(f"{who}: annotation {GPU_COUNT}={quoted(value)} is not allowed; "
                                "allowed: a whole number of GPUs greater than 0 in the digits 0-9, e.g. \"8\"")
    return int(text)


def strategy(who: str, value: object) -> Strategy:
    if value is None:
        return DEFAULT_STRATEGY
    try:
        return Strategy(str(value).strip().lower())
    except ValueError:
        allowed = ", ".join(s.value for s in STRATEGIES)
        raise InvalidAnnotation(f"{who}: annotation {STRATEGY}={quoted(value)} is not allowed; allowed: {allowed}") from None


def boolean(who: str, key: str, value: object) -> bool:
    if value is None:
        return False
    text = str(value).strip().lower()
    if text not in _BOOLEANS:
        raise InvalidAnnotation(f"{who}: annotation {key}={quoted(value)} is not allowed; allowed: true, false")
    return _BOOLEANS[text]


def preferred_domain(who: str, value: object) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    if not text or any(c.isspace() for c in text):
        raise InvalidAnnotation(f"{who}: annotation {PREFERRED_DOMAIN}={quoted(value)} is not allowed; "
                                "allowed: a domain's label value (leaf-1) or LEVEL=VALUE (spine=spine-1)")
    return text


def peer_strategy(annotations: Mapping) -> str | None:
    if any(key in annotations for key in PEER_REQUIRED):
        return Strategy.CONSOLIDATED.value
    return Strategy.BALANCED.value if any(key in annotations for key in PEER_PREFERRED) else None


def max_domain(who: str, annotations: Mapping) -> str | None:
    """Ours, else a peer's required level; the placement core checks it names a level."""
    key = next((k for k in (MAX_DOMAIN, *PEER_REQUIRED) if k in annotations), None)
    if key is None:
        return None
    text = str(annotations[key]).strip()
    if not text or any(c.isspace() for c in text):
        raise InvalidAnnotation(f"{who}: annotation {key}={quoted(annotations[key])} is not allowed; "
                                "allowed: a topology level's name (leaf) or node label key (topology.scheduler/leaf)")
    return text


def bandwidth(who: str, value: object) -> float | None:
    """Gb/s. Only bits per second: a byte unit (`200GB`, which would ask for 1600 Gb/s) is refused,
    not multiplied by 8, since links are rated (and this annotation is mostly written) in bits."""
    if value is None:
        return None
    why = ""
    try:
        gbps = parse_bandwidth_gbps(str(value), bits_only=True)
    except BandwidthInBytes:
        gbps, why = 0.0, " (a capital B is bytes per second; links are rated in bits: Gb, not GB)"
    except ValueError:
        gbps = 0.0
    if gbps <= 0:
        raise InvalidAnnotation(f"{who}: annotation {NETWORK_BANDWIDTH}={quoted(value)} is not allowed{why}; "
                                f"allowed: a bandwidth above 0 in bits per second, a number with the unit "
                                f"{BANDWIDTH_UNITS}, such as 200Gb, 400Gbps or 1.6Tb")
    return gbps
