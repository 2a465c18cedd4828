"""The vocabulary every layer above shares: the placement model (requests, decisions, reasons),
GPU sets, resource arithmetic, the record of what we inject, and the named orderings. Pure: no I/O."""
