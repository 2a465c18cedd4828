"""Publishing discovery's labels and annotations on the agent's own Node through the Kubernetes
API: only the keys it owns, and only when they changed."""
from __future__ import annotations

import json
from typing import Any, Callable

from .derive import Publication, node_patch
from .facts import EXIT_API, DiscoveryError

API_TIMEOUT_SECONDS = 30  # per API request, so a stuck connection cannot hang the agent


class NodeApi:
    """GET and merge-PATCH one Node through the `kubernetes` client."""

    def __init__(self, kubeconfig: str | None) -> None:
        from kubernetes import client

        from ..credentials.kubeclient import KubeconfigError, api_client_from
        try:
            self._api = client.CoreV1Api(api_client_from(kubeconfig))
        except KubeconfigError as err:
            raise DiscoveryError(f"Kubernetes {err}", EXIT_API) from None

    def _call(self, what: str, call: Callable[..., Any], *call_args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return call(*call_args, **kwargs)
        except ApiException as err:
            raise DiscoveryError(f"Kubernetes API: {what}: {err.status} {err.reason}", EXIT_API) from None
        except HTTPError as err:
            raise DiscoveryError(f"Kubernetes API: {what}: {type(err).__name__}: {err}", EXIT_API) from None

    def get(self, name: str) -> dict:
        response = self._call(f"GET node {name}", self._api.read_node, name, _preload_content=False,
                              _request_timeout=API_TIMEOUT_SECONDS)
        return json.loads(response.data)

    def patch(self, name: str, body: dict) -> None:
        self._call(f"PATCH node {name}", self._api.patch_node, name, body,
                   _content_type="application/merge-patch+json", _request_timeout=API_TIMEOUT_SECONDS)


def publish(api: NodeApi, node_name: str, wanted: Publication) -> dict | None:
    """Patch the node's owned keys when they differ; returns the patch sent, or None."""
    patch = node_patch(api.get(node_name), wanted)
    if patch:
        api.patch(node_name, patch)
    return patch
