"""The placement core: pure Python, no I/O. Cluster model, per-domain capacity index, ledger, decision."""
