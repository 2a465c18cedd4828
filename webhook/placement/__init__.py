"""Placement decisions over the cluster state: the decision (decide.py), waiting, protection of the
waiting, how a decision is held (enforce.py), the bandwidth estimate, and the placer that decides
and holds under the index's lock. Pure: no I/O."""
