"""How one node, or one domain's sums, read on the topology page: GPU counts, one letter per GPU
grouped by NVLink domain, and the overview's colour (its `state`). Called under the index lock."""
from __future__ import annotations

import re

from ...core.gpus import nvlink_groups
from ...state.stats import reserved_on
from ...state.tree import NodeState

USED, HELD, FREE, OUT = "u", "h", "f", "x"  # one letter per GPU in a node's NVLink groups
FREE_COUNT = {FREE: "free", OUT: "out"}  # the count an idle node's every GPU is in
_DIGITS = re.compile(r"(\d+)")


def natural(name: str) -> tuple:
    """leaf-2 before leaf-10."""
    return tuple(int(part) if part.isdigit() else part for part in _DIGITS.split(name))


def split_key(key: str) -> tuple[str, str, str]:
    """namespace, kind, name of a reservation key (namespace/Kind/name)."""
    namespace, _, rest = key.partition("/")
    kind, _, name = rest.partition("/")
    return namespace, kind, name


def node_counts(node: NodeState) -> dict[str, int]:
    """total = used + held + free + out. Free is what placement counts on; of the rest, pods come
    first (a pod the scheduler bound onto held GPUs is real, the hold is a promise) and what
    neither takes on an out-of-service node is out."""
    free = node.free
    used = min(node.used, node.gpus - free)
    held = reserved_on(node) if node.held else 0  # nothing held: none reserved, without counting the pods again
    return {"total": node.gpus, "used": used, "held": held, "free": free, "out": node.gpus - free - used - held}


def state_of(gpus: dict[str, int], out_of_service: bool = False) -> str:
    """The overview's word for a node's or a domain's GPUs: "out" (every GPU out of service, or the
    node is), "free" (every GPU in service free), "part" (some free), "held" (none free, some held
    for admitted workloads), "used" (none free)."""
    if out_of_service or gpus["out"] == gpus["total"]:
        return "out"
    if gpus["free"] == gpus["total"] - gpus["out"]:
        return "free"
    if gpus["free"]:
        return "part"
    return "held" if gpus["held"] else "used"


def gpu_states(node: NodeState, counts: dict[str, int]) -> list[str]:
    """One letter per GPU, grouped by NVLink domain (a GPU in none is a group of its own). The
    indices come from the pods' and holds' GPU sets; where those overlap (a pod the scheduler put
    on held GPUs), the letters follow the counts, which are what placement goes by."""
    groups = nvlink_groups(node.nvlink_domains, node.gpus)
    idle = FREE if node.eligible else OUT
    if not node.pods and not node.held and counts[FREE_COUNT[idle]] == node.gpus:  # most nodes: nothing to place
        return [idle * len(group) for group in groups]
    used_ids = {i for _, ids in node.pods.values() for i in ids}
    held_ids = {i for ids in node.held for i in ids}
    letters = [USED if i in used_ids else HELD if i in held_ids else idle for group in groups for i in group]
    wanted = {USED: counts["used"], HELD: counts["held"], FREE: counts["free"], OUT: counts["out"]}
    excess = {letter: letters.count(letter) - amount for letter, amount in wanted.items()}
    if any(excess.values()):
        missing = iter([letter for letter, extra in excess.items() for _ in range(-extra)])
        for position in reversed(range(len(letters))):
            if excess[letters[position]] > 0:
                excess[letters[position]] -= 1
                letters[position] = next(missing)
    text = "".join(letters)
    out, start = [], 0
    for group in groups:
        out.append(text[start:start + len(group)])
        start += len(group)
    return out

