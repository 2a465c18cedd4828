"""topology-webhook: a mutating admission webhook that places GPU workloads by topology."""

__version__ = "0.1.0"
