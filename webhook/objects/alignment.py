"""Device alignment the DRA allocator honours, written into a ResourceClaimTemplate at its CREATE
when it asks for it (`topology.scheduler/align`); opt-in, never on templates that do not ask.

The allocator takes the first devices that satisfy a claim and does no scoring (the
resource.k8s.io/v1 API says so), so alignment is only what the claim requires:
- `pcie`: a GPU request and a NIC request of one device each are paired on one PCIe root
  (`matchAttribute: resource.kubernetes.io/pcieRoot`). One constraint ties every device of the
  requests it names to one root, so multi-device requests cannot be paired this way (the
  template would need one request pair per GPU, which renames requests its pods refer to): such a
  template is left as written, with a warning.
- `numa`: every device of the claim on one NUMA node (`matchAttribute:
  resource.kubernetes.io/numaNode`, the attribute standardised in Kubernetes 1.37).
A constraint already on that attribute is the user's and is kept. What stays a hint: which GPUs
of a node share an NVLink domain (NVIDIA's driver publishes no NVLink attribute on its devices,
so no claim can ask for it); that is the `gpu-ids` annotation. Across nodes, the NVLink domain is
the `nvidia.com/gpu.clique` node label, kept by node affinity. Pure: objects in, values out.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Mapping

from ..core.model import MAPPINGS, quoted
from ..state.dra import CHANNEL_CLASS, RESOURCE_GROUP
from .templates import display_name, mapping_of
from .user_annotations import ALIGN, InvalidAnnotation

PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
NUMA_NODE = "resource.kubernetes.io/numaNode"
ATTRIBUTES = {"pcie": PCIE_ROOT, "numa": NUMA_NODE}


def handles(group: str, kind: str) -> bool:
    return group == RESOURCE_GROUP and kind == "ResourceClaimTemplate"


def _choice(request: Mapping) -> Mapping:
    """A request's first choice: `exactly`, else the first of `firstAvailable`."""
    exactly = request.get("exactly")
    if isinstance(exactly, MAPPINGS):
        return exactly
    options = request.get("firstAvailable")
    return options[0] if isinstance(options, list) and options and isinstance(options[0], MAPPINGS) else {}


def _one_device(choice: Mapping) -> bool:
    return choice.get("allocationMode", "ExactCount") == "ExactCount" and choice.get("count", 1) == 1


def aligned(obj: Mapping, namespace: str, is_gpu_class: Callable[[str], bool]) -> tuple[dict | None, list[str]]:
    """(the template with the constraint its annotation asks for, or None to leave it; warnings).
    Raises InvalidAnnotation for a value that is not one of ours."""
    who = display_name("ResourceClaimTemplate", obj, namespace)
    annotations = mapping_of(mapping_of(obj.get("metadata")).get("annotations"))
    if ALIGN not in annotations:
        return None, []
    how = str(annotations[ALIGN]).strip().lower()
    if how not in ATTRIBUTES:
        raise InvalidAnnotation(f"{who}: annotation {ALIGN}={quoted(annotations[ALIGN])} is not allowed; allowed: "
                                f"{', '.join(ATTRIBUTES)}")
    out = copy.deepcopy(dict(obj))
    devices = ((out.get("spec") or {}).get("spec") or {}).get("devices")
    if not isinstance(devices, dict) or not isinstance(devices.get("requests"), list):
        return None, [f"{who}: {ALIGN}={how}, but it has no device requests to align"]
    found = devices.get("constraints")
    constraints: list = found if isinstance(found, list) else []
    attribute = ATTRIBUTES[how]
    if any(isinstance(c, MAPPINGS) and c.get("matchAttribute") == attribute for c in constraints):
        return None, []  # the user's own
    requests: list[Mapping] = [r for r in devices["requests"] if isinstance(r, MAPPINGS) and r.get("name")]
    if how == "numa":
        named: list[str] = []  # empty: every request of the claim
    else:
        gpus = [r for r in requests if is_gpu_class(str(_choice(r).get("deviceClassName", "")))]
        nics = [r for r in requests if r not in gpus and _choice(r).get("deviceClassName") != CHANNEL_CLASS]
        if len(gpus) != 1 or len(nics) != 1 or not all(_one_device(_choice(r)) for r in (*gpus, *nics)):
            return None, [f"{who}: {ALIGN}=pcie pairs one GPU with one NIC (a request of one device each); this "
                          "template asks otherwise and is left as written (one constraint ties every device of "
                          "its requests to one PCIe root)"]
        named = [str(gpus[0]["name"]), str(nics[0]["name"])]
    devices["constraints"] = [*constraints, {**({"requests": named} if named else {}), "matchAttribute": attribute}]
    return out, []
