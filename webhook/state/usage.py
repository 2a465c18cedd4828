"""What bound pods request of every resource but GPUs: per pod, and summed per node (the sum is
the very dict NodeState.requested reads, so a node sees its pods' requests without a copy).
GPUs are counted apart, on the nodes themselves (topology.NodeState.pods)."""
from __future__ import annotations

Requests = tuple[tuple[str, int], ...]  # sorted (resource, amount): resources.pod_requests


class ResourceUsage:
    def __init__(self) -> None:
        self._by_pod: dict[str, tuple[str, Requests]] = {}  # pod key -> (node, its requests)
        self._on_node: dict[str, dict[str, int]] = {}  # node name -> summed requests

    def on_node(self, name: str) -> dict[str, int]:
        """The node's summed requests, kept current from now on (NodeState.requested)."""
        return self._on_node.setdefault(name, {})

    def pods(self) -> set[str]:
        return set(self._by_pod)

    def use(self, pod: str, node: str | None, requests: Requests) -> set[str]:
        """The pod now requests `requests` on `node` (None: it is bound nowhere). Returns the nodes
        whose sums changed; nothing for a status update that changes neither."""
        old = self._by_pod.get(pod)
        if old == (node, requests):
            return set()
        changed = set()
        if old is not None:
            self._add(*old, -1)
            del self._by_pod[pod]
            changed.add(old[0])
        if node is not None:
            self._by_pod[pod] = (node, requests)
            self._add(node, requests, +1)
            changed.add(node)
        return changed

    def _add(self, node: str, requests: Requests, sign: int) -> None:
        summed = self.on_node(node)
        for name, amount in requests:
            summed[name] = summed.get(name, 0) + sign * amount
