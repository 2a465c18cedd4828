"""What the adapters share to talk and to be talked to safely: the one way to reach the Kubernetes
API (kubeclient.py), the TLS certificates the webhook serves with (certs.py), and who may read the
metrics port (access.py, deciding from answers the cluster gives). Below every adapter (kube,
serving, discover), so that none of them imports another."""
