"""Where the server listens and what it serves; the Helm chart and the tests read these."""

DEFAULT_PORT = 8443
MUTATE_PATH = "/mutate"
HEALTHZ_PATH = "/healthz"
READYZ_PATH = "/readyz"
METRICS_PATH = "/metrics"
TOPOLOGY_PATH = "/topology"  # the topology page, on the metrics port
TOPOLOGY_JSON_PATH = "/topology.json"
