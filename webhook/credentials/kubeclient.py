"""The one way this project connects to the Kubernetes API: a kubeconfig file, or inside a pod the
service account's in-cluster config."""
from __future__ import annotations

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.config.config_exception import ConfigException

from ..settings.config import ConfigError


class KubeconfigError(ConfigError):
    """No API client can be made; the message names the source and, in-cluster, what to pass."""


def api_client_from(kubeconfig: str | None) -> k8s_client.ApiClient:
    """An API client from a kubeconfig file, or from the pod's service account when None."""
    configuration = k8s_client.Configuration()
    try:
        if kubeconfig:
            k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        else:
            k8s_config.load_incluster_config(client_configuration=configuration)
    except (ConfigException, OSError) as err:
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "in-cluster config"
        hint = "" if kubeconfig else " (not running in a pod? pass --kubeconfig FILE)"
        raise KubeconfigError(f"{where}: {str(err).strip() or type(err).__name__}{hint}") from None
    return k8s_client.ApiClient(configuration)
