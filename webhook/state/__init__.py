"""The cluster as the webhook sees it: the index (a front that applies what the feeds bring under
one lock), the topology tree and its best-fit orders, holds, pods held by our gate, pinned waits,
DRA devices, node pools that can grow, and the constrained subsets. No decisions are made here."""
