"""The node agent: NVML topology discovery published as node labels and annotations."""
