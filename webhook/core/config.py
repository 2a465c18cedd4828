"""Settings: topology levels and presets, hardware profiles, NCCL profiles, admission policy.

`Config` is a frozen value built from defaults, an optional YAML file and command-line flags.
Nothing here reads the environment or the disk at import time; `load_config(path)` is the one
function that opens a file.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import re
from dataclasses import dataclass, field
from typing import IO, Any, Iterable, Mapping

import yaml

HOSTNAME_LABEL = "kubernetes.io/hostname"

# Where the server listens and what it serves; the Helm chart and the tests read these.
DEFAULT_PORT = 8443
MUTATE_PATH = "/mutate"
HEALTHZ_PATH = "/healthz"
READYZ_PATH = "/readyz"
METRICS_PATH = "/metrics"
TOPOLOGY_PATH = "/topology"  # the topology page, on the metrics port
TOPOLOGY_JSON_PATH = "/topology.json"
LINK_CLASSES = ("nvlink", "leaf", "spine", "zone", "cluster")
# ProvisioningRequest classes (https://github.com/kubernetes/autoscaler/blob/master/cluster-autoscaler/proposals/provisioning-request.md):
# scale up all the group's nodes or none; only check that they fit; GKE's queued provisioning.
PROVISIONING_CLASSES = ("best-effort-atomic-scale-up.autoscaling.x-k8s.io", "check-capacity.autoscaling.x-k8s.io",
                        "queued-provisioning.gke.io")


class ConfigError(ValueError):
    """A setting is wrong; the message names the setting, the value and what is allowed."""


@dataclass(frozen=True)
class Level:
    """One topology level: the node label that names its domains, widest level first."""

    label: str
    name: str  # short name used in reasons and metrics ("zone", "spine", "leaf", "clique")
    link: str  # traffic between nodes inside one domain of this level crosses this link class
    # Bandwidth divisor once traffic crosses this domain's children (leaf->spine uplinks for a
    # spine). Defaults are estimates: leaf uplinks 1-4:1 and zone tiers 4-15:1 are the usual sweep
    # (docs/design/cost-model.md).
    oversubscription: float = 1.0


# Presets: label keys per platform. kubernetes.io/hostname is always the implicit last level.
PRESETS: dict[str, tuple[Level, ...]] = {
    "default": (
        Level("topology.kubernetes.io/zone", "zone", "zone", 4.0),
        Level("topology.scheduler/spine", "spine", "spine", 1.0),
        Level("topology.scheduler/leaf", "leaf", "leaf", 1.0),
    ),
    # GKE: block > sub-block (rack) > physical host (Kueue TAS uses the same levels).
    "gke": (
        Level("cloud.google.com/gce-topology-block", "block", "spine", 2.0),
        Level("cloud.google.com/gce-topology-subblock", "subblock", "leaf", 1.0),
        Level("cloud.google.com/gce-topology-host", "host", "leaf", 1.0),
    ),
    # EKS: layer-1 is the broadest network node, layer-3 the one nearest the instance.
    "aws": (
        Level("topology.k8s.aws/network-node-layer-1", "layer-1", "zone", 4.0),
        Level("topology.k8s.aws/network-node-layer-2", "layer-2", "spine", 1.0),
        Level("topology.k8s.aws/network-node-layer-3", "layer-3", "leaf", 1.0),
    ),
    # Multi-node NVLink (GB200/GB300 NVL72): nodes of one clique share an NVLink fabric.
    "nvl72": (
        Level("topology.kubernetes.io/zone", "zone", "zone", 4.0),
        Level("topology.scheduler/spine", "spine", "spine", 1.0),
        Level("nvidia.com/gpu.clique", "clique", "nvlink", 1.0),
    ),
}


@dataclass(frozen=True)
class HardwareProfile:
    """All-reduce bus bandwidths (GB/s, nccl-tests busbw) per link class for one kind of node.

    Figures are nccl-tests busbw measurements reported in NVIDIA/nccl and NVIDIA/nccl-tests issues
    (each source in docs/design/cost-model.md); `estimate` marks profiles with at least one figure
    that is not a measurement.
    """

    name: str
    match: str  # regular expression searched in the nvidia.com/gpu.product label
    nvlink_gbs: float  # ring busbw inside one NVLink domain
    pcie_gbs: float  # busbw once a ring leaves an NVLink domain inside the node
    nic_gbs: float  # per NIC
    nics_per_node: int
    nvlink_domain_size: int = 0  # GPUs per NVSwitch domain when the node does not publish its domains
    estimate: bool = False


DEFAULT_PROFILES: tuple[HardwareProfile, ...] = (
    HardwareProfile("gb200-nvl72", r"GB[23]00", 720.0, 50.0, 48.0, 4, 4, estimate=True),
    HardwareProfile("b200-sxm", r"B[23]00", 720.0, 50.0, 48.0, 8, 8, estimate=True),
    HardwareProfile("h100-sxm", r"H(100|200|800|20)(?!.*(PCIe|NVL))", 370.0, 50.0, 48.0, 8, 8),
    HardwareProfile("a100-sxm", r"A100-SXM", 230.0, 25.0, 23.0, 8, 8),
    HardwareProfile("h100-pcie", r"H100.*(PCIe|NVL)", 116.0, 50.0, 48.0, 2, estimate=True),
    HardwareProfile("generic-pcie", r"", 25.0, 25.0, 23.0, 1),
)

# NCCL settings per interconnect class. Only variables whose values NCCL validates loosely are
# set: an unknown NCCL_ALGO token fails communicator init, so algorithms are never forced.
DEFAULT_NCCL_PROFILES: Mapping[str, Mapping[str, str]] = {
    "nvlink": {"NCCL_P2P_LEVEL": "NVL"},
    "pcie": {"NCCL_P2P_LEVEL": "SYS"},
    "node": {"NCCL_IB_DISABLE": "0", "NCCL_NET_GDR_LEVEL": "PHB"},
    "leaf": {"NCCL_IB_DISABLE": "0", "NCCL_NET_GDR_LEVEL": "PHB", "NCCL_CROSS_NIC": "0"},
    "spine": {"NCCL_IB_DISABLE": "0", "NCCL_NET_GDR_LEVEL": "PHB", "NCCL_CROSS_NIC": "2"},
    "zone": {"NCCL_IB_DISABLE": "0", "NCCL_NET_GDR_LEVEL": "PHB", "NCCL_CROSS_NIC": "2", "NCCL_IB_TIMEOUT": "22"},
    "cluster": {"NCCL_IB_DISABLE": "0", "NCCL_NET_GDR_LEVEL": "PHB", "NCCL_CROSS_NIC": "2", "NCCL_IB_TIMEOUT": "22"},
}


PROCESS_SEAL_KEY = os.urandom(32)


def _setting(default: Any = dataclasses.MISSING, doc: str = "", **kwargs: Any) -> Any:
    """A field of Config that is also a key of the settings file, with its documentation: what it
    does, for docs/reference/settings.md (generated by .ci/reference_docs.py, which adds the type,
    bounds and default from the code). Markdown; links name files from the repository's root."""
    return field(default=default, metadata={"doc": " ".join(doc.split())}, **kwargs)


@dataclass(frozen=True)
class Config:
    # The default preset's levels until the nodes are read: with `levels: auto` (the default) the
    # cluster index chooses the preset from their labels, and again whenever they change.
    levels: tuple[Level, ...] = _setting(PRESETS["default"], doc="""
        The topology levels, widest first: for each, the node label whose values name its domains.
        `auto` (the default): the preset the nodes' labels call for, chosen again whenever they
        change, with a warning in the log when none fits; or a preset by name; or a list of label
        keys, each with an optional short `name` (in reasons and metrics), the `link` class its
        traffic crosses and the `oversubscription` of its uplinks. `kubernetes.io/hostname` is
        always the implicit last level. Presets and `auto`: [topology model](docs/concepts.md#topology-model).""")
    levels_auto: bool = True  # not a key of the file: follows from `levels: auto`
    cluster_oversubscription: float = _setting(8.0, doc="""
        The bandwidth divisor once traffic crosses the widest level's domains (between zones, say):
        the cost model's estimate of the fabric above them ([cost model](docs/design/cost-model.md)).""")
    profiles: tuple[HardwareProfile, ...] = _setting(DEFAULT_PROFILES, doc="""
        Hardware profiles: the all-reduce bus bandwidths (GB/s, as nccl-tests reports busbw) per
        link class of one kind of node, chosen by the first `match` found in the node's
        `nvidia.com/gpu.product` label. A list given here replaces the built-in profiles; the
        generic PCIe profile always stays last, for nodes no pattern matches
        ([cost model](docs/design/cost-model.md)).""")
    nccl_profiles: Mapping[str, Mapping[str, str]] = _setting(doc="""
        NCCL environment variables injected per interconnect class, the class being the widest
        link the placed workload's traffic crosses. A class given here replaces that class's whole
        built-in set (it is not merged variable by variable: repeat the built-in variables to keep);
        classes left out keep theirs ([below](#built-in-nccl-profiles)). Only variables whose values
        NCCL validates loosely belong here: an unknown `NCCL_ALGO` token fails communicator init.""",
        default_factory=lambda: dict(DEFAULT_NCCL_PROFILES))
    scheduler_names: tuple[str, ...] = _setting(("topology-aware-scheduler",), doc="""
        Pods naming one of these schedulers (`schedulerName`) are ours even without an annotation:
        the webhook places them and hands them to `default_scheduler`, and the chart's match
        conditions send them to it. An empty list: only annotations make a workload ours.""")
    default_scheduler: str = _setting("default-scheduler", doc="""
        The scheduler our pods are handed to (`schedulerName`), in place of one of `scheduler_names`.""")
    pin_when_waiting: bool = _setting(True, doc="""
        Pin waiting workloads: a consolidated one waits for locality instead of scattering, and a
        balanced one too where `pin_only_where_locality_pays` weighs the wait. `false`: every wait
        only prefers its domain ([how placement decides](docs/concepts.md#waiting)).""")
    pin_only_where_locality_pays: bool = _setting(True, doc="""
        Pin a consolidated or balanced wait only as wide as waiting pays: to the widest domain the
        cost model gives the same bandwidth as the one that fits first, or wider where the wait it
        saves outweighs the slower run (`communication_share`); not at all when that is the whole
        cluster, so a one-pod job only prefers the node that frees first. `false`: consolidated
        waits are pinned where they fit first, balanced ones only prefer it
        ([how placement decides](docs/concepts.md#waiting)).""")
    communication_share: float = _setting(0.1, doc="""
        The share of a multi-node job's run time spent in collective communication at its tightest
        placement, which a lower bandwidth stretches: it weighs a wait for locality against spanning
        a level wider. 0: communication costs nothing, so no wait is pinned
        ([how placement decides](docs/concepts.md#waiting)).""")
    protect_waiting_seconds: float = _setting(1800.0, doc="""
        For how long a pinned wait keeps new work that has an equally tight place elsewhere off the
        GPUs it needs in its domain (oldest waiters first, at most each one's own need); 0: never.
        With many waits pinned it adds tens of milliseconds to a placement in a domain they wait in;
        in the simulator at 8,192 GPUs under overload it made the large jobs it serves finish later,
        so 0 suits such clusters today ([how placement decides](docs/concepts.md#waiting)).""")
    gate_waits: bool = _setting(True, doc="""
        A pinned wait for room in a workload whose work ends (a Job, a bare pod, an operator's
        group) is held by the scheduling gate `topology.scheduler/placement` instead of the pin:
        every replica's releaser decides it again whenever room opens, oldest first, and starts it
        in its domain or one no wider, pinned there. Waits for nodes to be added are never gated (a
        gated pod never triggers an autoscaler). Needs RBAC `pods/patch` (the chart grants it with
        the setting); pods still gated when it is turned off stay gated until the webhook with it on
        releases them, or `kubectl patch` removes the gate
        ([how placement decides](docs/concepts.md#waiting)).""")
    refuse_unplaceable: bool = _setting(False, doc="""
        Deny a workload the nodes there are cannot hold even when idle, for a cluster that never
        grows. `false`: it is admitted to wait for nodes an autoscaler (or a person) adds, with a
        warning ([autoscalers](docs/autoscalers.md)).""")
    provisioning_request_class: str = _setting("", doc="""
        A ProvisioningRequest class: a group that waits for nodes gets a ProvisioningRequest of it,
        for an all-or-nothing scale-up by cluster-autoscaler. `""`: none
        ([autoscalers](docs/autoscalers.md#atomic-scale-up-provisioningrequests-opt-in)).""")
    preferred_weight: int = _setting(100, doc="""
        The weight of our preferred node affinity (balanced placements). 100, the scheduler's
        maximum, outweighs a user's weaker preferences; lower it to let theirs count more.""")
    reservation_ttl_seconds: float = _setting(300.0, doc="""
        How long a placement holds its GPUs for pods not yet bound, so the next admission does not
        hand them out twice; the hold then lapses (deleting a workload we placed frees it at once).""")
    max_body_bytes: int = _setting(3 * 1024 * 1024, doc="""
        The largest admission request body served; larger ones are answered 413. At most the
        apiserver's own request limit, so no object it would store is refused.""")
    stale_after_seconds: float = _setting(120.0, doc="""
        How long a stream of the cluster view fed from the API (nodes, pods, ...) may go without
        list or watch progress before `/readyz` says not ready and admissions pass unplaced
        (`not-ready`); each watch is ended well inside it (a third of it, at most 300 s), so a quiet
        healthy stream still shows progress.""")
    # The key that seals what a gated wait is released from (injection.seal_gate): not a setting of
    # the file, but `serve --gate-key-secret` (a Secret every replica reads). Without
    # one, a key of this process: enough for one process (the demo, `mutate`, tests).
    seal_key: bytes = field(default=PROCESS_SEAL_KEY, repr=False, compare=False)

    def profile_for(self, product: str) -> HardwareProfile:
        return _profile_for(tuple(self.profiles), (product or "")[:LABEL_VALUE_MAX])


LABEL_VALUE_MAX = 63  # a label value's length limit: the API never holds a longer product name


@functools.lru_cache(maxsize=1024)
def _profile_for(profiles: tuple[HardwareProfile, ...], product: str) -> HardwareProfile:
    """The first profile whose pattern is found in `product`: once per product name, not per node."""
    for profile in profiles:
        if re.search(profile.match, product):
            return profile
    return profiles[-1]


# Labels that only one preset's clusters carry, most specific first: a cluster labelled for
# several (a GKE cluster whose nodes also carry our leaf label) takes the first that covers most nodes.
_PRESET_MARKS: tuple[tuple[str, str], ...] = (
    ("nvl72", "nvidia.com/gpu.clique"),
    ("gke", "cloud.google.com/gce-topology-block"),
    ("aws", "topology.k8s.aws/network-node-layer-1"),
    ("default", "topology.scheduler/leaf"),
    ("default", "topology.scheduler/spine"),
)


def preset_marks(labels: Mapping[str, str]) -> frozenset[str]:
    """The presets whose distinguishing label a node carries."""
    return frozenset(preset for preset, label in _PRESET_MARKS if label in labels)


def detect_preset(node_labels: Iterable[Mapping[str, str]]) -> tuple[str, str | None]:
    """(preset, warning) for a list of nodes' labels: see choose_preset."""
    counts: dict[str, int] = {}
    total = 0
    for labels in node_labels:
        total += 1
        for preset in preset_marks(labels):
            counts[preset] = counts.get(preset, 0) + 1
    return choose_preset(counts, total)


def choose_preset(counts: Mapping[str, int], total: int) -> tuple[str, str | None]:
    """(preset, warning): the preset whose distinguishing label most of `total` nodes carry
    (`counts`: nodes per preset), and a warning when none does (every node is then alone below
    its zone, so placement can only pack single nodes well)."""
    counts = {preset: n for preset, n in counts.items() if n > 0}
    if not counts:
        marks = ", ".join(label for _, label in _PRESET_MARKS)
        return "default", (f"levels: auto found none of {marks} on {total} node(s); using the default preset, "
                           "so every node is its own domain below the zone: label the nodes or set levels")
    order = [preset for preset, _ in _PRESET_MARKS]
    best = max(counts, key=lambda preset: (counts[preset], -order.index(preset)))
    return best, None


def levels_from(spec: Any) -> tuple[Level, ...]:
    """Levels from a preset name or a list of labels / {label, name, link, oversubscription} maps."""
    if isinstance(spec, str):
        if spec not in PRESETS:
            raise ConfigError(f"levels: unknown preset {spec!r}; allowed: auto, {', '.join(sorted(PRESETS))}")
        return PRESETS[spec]
    if not isinstance(spec, list) or not spec:
        raise ConfigError(f"levels: {spec!r} is not a preset name or a non-empty list of node label keys")
    entries = [e if isinstance(e, dict) else {"label": e} for e in spec]
    if entries[-1].get("label") == HOSTNAME_LABEL:
        entries = entries[:-1]  # the node level is always implicit
    defaults = ("leaf", "spine", "zone") + ("cluster",) * len(entries)
    levels = []
    for depth, entry in enumerate(reversed(entries)):
        label = entry.get("label")
        if not isinstance(label, str) or not is_label_key(label) or label == HOSTNAME_LABEL:
            raise ConfigError(f"levels[{len(entries) - 1 - depth}]: {label!r} is not a node label key "
                              f"(an optional DNS subdomain prefix and '/', then a name of letters, digits, "
                              f"'-', '_' and '.'; {HOSTNAME_LABEL} may only be last)")
        link = entry.get("link", defaults[depth])
        if link not in LINK_CLASSES:
            raise ConfigError(f"levels: link {link!r} of {label} is not one of {', '.join(LINK_CLASSES)}")
        where = f"levels[{len(entries) - 1 - depth}]"
        _no_unknown(where, entry, {f.name for f in dataclasses.fields(Level)})
        name = _text(f"{where}.name", entry.get("name", label.rsplit("/", 1)[-1]))
        oversubscription = _number(f"{where}.oversubscription", entry.get("oversubscription", 1.0),
                                   *_LEVEL_OVERSUBSCRIPTION)
        levels.append(Level(label, name, link, oversubscription))
    labels = [lv.label for lv in levels]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"levels: label keys must be unique, got {list(reversed(labels))}")
    return tuple(reversed(levels))


# Bounds of the scalar settings: (type, least, most). Outside them a setting is a mistake (a TTL of
# 0 s would drop every hold at once; a body limit above the apiserver's own 3 MiB is never used).
_SCALARS: Mapping[str, tuple[type, float, float]] = {
    "cluster_oversubscription": (float, 1.0, 1000.0),
    "reservation_ttl_seconds": (float, 1.0, 86400.0),
    "stale_after_seconds": (float, 5.0, 86400.0),
    "protect_waiting_seconds": (float, 0.0, 86400.0),
    "communication_share": (float, 0.0, 1.0),
    "max_body_bytes": (int, 1024, 3 * 1024 * 1024),
    "preferred_weight": (int, 1, 100),
}
_LEVEL_OVERSUBSCRIPTION: tuple[type, float, float] = (float, 1.0, 1000.0)
_PROFILE_REQUIRED = ("name", "match", "nvlink_gbs", "pcie_gbs", "nic_gbs", "nics_per_node")
_PROFILE_NUMBERS: Mapping[str, tuple[type, float, float]] = {
    "nvlink_gbs": (float, 0.001, 100000.0), "pcie_gbs": (float, 0.001, 100000.0), "nic_gbs": (float, 0.001, 100000.0),
    "nics_per_node": (int, 1, 64), "nvlink_domain_size": (int, 0, 1024),
}
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# As Kubernetes validates them (apimachinery's validation): a DNS-1123 subdomain (scheduler names,
# a label key's prefix) and a qualified name (a label key: an optional prefix, then `/` and a name).
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def is_dns_subdomain(text: str) -> bool:
    return len(text) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(text) is not None


def is_label_key(text: str) -> bool:
    prefix, _, name = text.rpartition("/")
    return (len(name) <= 63 and _LABEL_NAME.fullmatch(name) is not None
            and (not prefix and "/" not in text or is_dns_subdomain(prefix)))


def _show(value: Any) -> str:
    """The offending value, short enough for one line."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _plain(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else str(bound)


def _no_unknown(where: str, entry: Any, known: set[str]) -> None:
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: {_show(entry)} is not a mapping; allowed keys: {', '.join(sorted(known))}")
    unknown = sorted(str(k) for k in set(entry) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")


def _number(key: str, value: Any, kind: type, least: float, most: float) -> Any:
    """`value` as `kind` within [least, most]; YAML's `true` or `"5"` is not a number."""
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not whole):
        noun = "a whole number" if kind is int else "a number"
        raise ConfigError(f"{key}: {_show(value)} is not {noun}; allowed: {noun} from {_plain(least)} to {_plain(most)}")
    if not least <= value <= most:
        raise ConfigError(f"{key}: {_show(value)} is out of range; allowed: {_plain(least)} to {_plain(most)}")
    return kind(value)


def _text(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{key}: {_show(value)} is not allowed; allowed: a non-empty string")
    return value


SCHEDULER_NAME_RULE = "a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', at most 253 characters"


def _scheduler_name(key: str, value: Any) -> str:
    """A name the webhook writes into pods as schedulerName: what the API would accept there."""
    if not isinstance(value, str) or not is_dns_subdomain(value):
        raise ConfigError(f"{key}: {_show(value)} is not allowed; allowed: a scheduler name ({SCHEDULER_NAME_RULE})")
    return value


_YAML11_BOOLEANS = frozenset(("yes", "no", "on", "off", "y", "n"))


def _flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        hint = (" (YAML 1.1's yes/no/on/off are not booleans here)"
                if isinstance(value, str) and value.strip().lower() in _YAML11_BOOLEANS else "")
        raise ConfigError(f"{key}: {_show(value)} is not allowed; allowed: true, false{hint}")
    return value


# Profile patterns are searched in every node's product name with Python's backtracking engine, so
# a pattern that can backtrack exponentially ((a+)+$) would stall every admission: patterns are
# parsed once at load and refused unless their worst case stays polynomial and small.
PATTERN_MAX_CHARS = 256
PATTERN_MAX_VARIABLE_REPEATS = 4
PATTERN_RULE = (f"a regular expression of at most {PATTERN_MAX_CHARS} characters with no backreference, no "
                "repeat or alternation (|) inside a repeat that matches more than once (as in (a+)+, (a?){9} or "
                f"(ab|a)*), and at most {PATTERN_MAX_VARIABLE_REPEATS} repeats of variable length (*, +, ?, {{n,m}})")
try:  # the parser `re` compiles with: re._parser since Python 3.11, sre_parse before
    _sre_parser: Any = importlib.import_module("re._parser")
except ImportError:  # pragma: no cover - Python 3.10
    _sre_parser = importlib.import_module("sre_parse")
_REPEATS = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")


def _pattern_problem(pattern: str) -> str | None:
    """Why `pattern` could backtrack catastrophically, or None: walks the parsed pattern."""
    if len(pattern) > PATTERN_MAX_CHARS:
        return f"{len(pattern)} characters"
    variable = 0
    # (parsed items, whether they sit inside a repeat that matches more than once)
    stack: list[tuple[Any, bool]] = [(_sre_parser.parse(pattern), False)]
    while stack:
        items, repeated = stack.pop()
        for op, arg in items:
            name = getattr(op, "name", str(op))
            if name in ("GROUPREF", "GROUPREF_EXISTS"):
                return "a backreference"
            if name in _REPEATS:
                least, most, body = arg
                if least != most:
                    variable += 1
                    if repeated:
                        return "a repeat inside a repeat"
                stack.append((body, repeated or most > 1))
            elif name == "BRANCH":
                if repeated:
                    return "an alternation inside a repeat"
                stack.extend((branch, repeated) for branch in arg[1])
            elif name == "SUBPATTERN":
                stack.append((arg[-1], repeated))
            elif name in ("ASSERT", "ASSERT_NOT"):
                stack.append((arg[1], repeated))
            elif name == "ATOMIC_GROUP":
                stack.append((arg, repeated))
    if variable > PATTERN_MAX_VARIABLE_REPEATS:
        return f"{variable} repeats of variable length"
    return None


def _pattern(key: str, value: str) -> str:
    try:
        re.compile(value)
    except re.error as err:
        raise ConfigError(f"{key}: {_show(value)} is not a regular expression ({err})") from None
    problem = _pattern_problem(value)
    if problem:
        raise ConfigError(f"{key}: {_show(value)} is not allowed ({problem}: searching it could take exponential "
                          f"time); allowed: {PATTERN_RULE}")
    return value


def _profile(where: str, entry: Any) -> HardwareProfile:
    fields = {f.name for f in dataclasses.fields(HardwareProfile)}
    _no_unknown(where, entry, fields)
    missing = sorted(f for f in _PROFILE_REQUIRED if f not in entry)
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}")
    values: dict[str, Any] = {"name": _text(f"{where}.name", entry["name"])}
    match = entry["match"] if isinstance(entry["match"], str) else _text(f"{where}.match", entry["match"])
    values["match"] = _pattern(f"{where}.match", match)
    for key, bounds in _PROFILE_NUMBERS.items():
        if key in entry:
            values[key] = _number(f"{where}.{key}", entry[key], *bounds)
    if "estimate" in entry:
        values["estimate"] = _flag(f"{where}.estimate", entry["estimate"])
    return HardwareProfile(**values)


# A value becomes a container's environment: no character that could end or forge a line.
NCCL_VALUE_RULE = ("a string or number without control characters (newline, tab, any other character below U+0020, "
                   "or U+007F)")


def _nccl_profiles(value: Any) -> Mapping[str, Mapping[str, str]]:
    """The NCCL profiles: the built-in ones, each class given replaced whole by its variables."""
    _no_unknown("nccl_profiles", value, set(DEFAULT_NCCL_PROFILES))
    merged = dict(DEFAULT_NCCL_PROFILES)
    for link, variables in value.items():
        where = f"nccl_profiles.{link}"
        if not isinstance(variables, Mapping):
            raise ConfigError(f"{where}: {_show(variables)} is not a mapping of NCCL variables to values")
        for name, setting in variables.items():
            if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
                raise ConfigError(f"{where}: {_show(name)} is not an environment variable name")
            if isinstance(setting, bool) or not isinstance(setting, (str, int, float)):
                raise ConfigError(f"{where}.{name}: {_show(setting)} is not allowed; allowed: a string or number")
            if _CONTROL.search(str(setting)):
                raise ConfigError(f"{where}.{name}: {_show(setting)} is not allowed; allowed: {NCCL_VALUE_RULE}")
        merged[link] = {name: str(setting) for name, setting in variables.items()}
    return merged


_FLAGS = ("pin_when_waiting", "pin_only_where_locality_pays", "gate_waits", "refuse_unplaceable")
# The keys a settings file may hold, each read below. Not every Config field is one: `levels_auto`
# follows from `levels: auto`.
FILE_KEYS = frozenset((*_SCALARS, *_FLAGS, "levels", "profiles", "nccl_profiles", "scheduler_names",
                       "default_scheduler", "provisioning_request_class"))


def config_from_mapping(data: Mapping[str, Any]) -> Config:
    """A Config from parsed YAML, every setting checked for its type and bounds; unknown keys are
    errors so typos do not pass silently. Raises ConfigError naming the key, the value and what is
    allowed: a bad file stops start-up instead of failing every admission later."""
    unknown = sorted(str(k) for k in data if k not in FILE_KEYS)
    if unknown:
        hint = " (levels_auto follows from levels: auto)" if "levels_auto" in unknown else ""
        raise ConfigError(f"unknown setting(s) {', '.join(unknown)}{hint}; allowed: {', '.join(sorted(FILE_KEYS))}")
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key in _SCALARS:
            values[key] = _number(key, value, *_SCALARS[key])
        elif key == "levels" and value == "auto":
            values["levels_auto"] = True
        elif key == "levels":
            values[key] = levels_from(value)
            values["levels_auto"] = False
        elif key == "profiles":
            if not isinstance(value, list):
                raise ConfigError(f"profiles: {_show(value)} is not a list of hardware profiles")
            values[key] = tuple(_profile(f"profiles[{i}]", p) for i, p in enumerate(value)) + (DEFAULT_PROFILES[-1],)
        elif key == "nccl_profiles":
            values[key] = _nccl_profiles(value)
        elif key == "scheduler_names":
            if not isinstance(value, list):
                raise ConfigError(f"scheduler_names: {_show(value)} is not a list of scheduler names")
            values[key] = tuple(_scheduler_name(f"scheduler_names[{i}]", name) for i, name in enumerate(value))
        elif key == "default_scheduler":
            values[key] = _scheduler_name(key, value)
        elif key == "provisioning_request_class":
            if value not in ("", *PROVISIONING_CLASSES):
                raise ConfigError(f"{key}: {_show(value)} is not allowed; allowed: an empty string (none), "
                                  + ", ".join(PROVISIONING_CLASSES))
            values[key] = value
        elif key in _FLAGS:
            values[key] = _flag(key, value)
        else:  # pragma: no cover - every key of FILE_KEYS has its branch above
            raise AssertionError(f"setting {key} is accepted but not read")
    return Config(**values)


class SettingsLoader(yaml.SafeLoader):
    """YAML as PyYAML's safe loader reads it, but with YAML 1.2's booleans: only true and false (any
    case). YAML 1.1's yes/no/on/off/y/n stay strings, which a boolean setting refuses with a hint,
    instead of `on` quietly reading as true."""

    yaml_implicit_resolvers = {first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
                               for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


SettingsLoader.add_implicit_resolver("tag:yaml.org,2002:bool",
                                     re.compile(r"^(?:[Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee])$"), list("tTfF"))


def read_settings(stream: str | IO[str]) -> Any:
    """The YAML of a settings file, read by SettingsLoader: every reader of settings goes through here."""
    return yaml.load(stream, Loader=SettingsLoader)  # a SafeLoader: builds plain data only


def load_config(path: str | None) -> Config:
    if not path:
        return Config()
    try:
        with open(path, encoding="utf-8") as handle:
            data = read_settings(handle) or {}
    except OSError as err:
        raise ConfigError(f"config file {path}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path}: not UTF-8 text; expected a YAML mapping of settings") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path}: not valid YAML ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of settings")
    return config_from_mapping(data)
