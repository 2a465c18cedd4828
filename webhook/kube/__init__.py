"""The Kubernetes API side: the live cluster view (list/watch), claims between replicas, certificate bootstrap, the demo cluster."""
