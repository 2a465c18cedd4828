"""ProvisioningRequests over the API: the PodTemplate and the ProvisioningRequest a waiting group
gets (webhook/objects/provisioning.py makes them), created during its admission and deleted with
the workload.

Creating is idempotent (the names are the workload's own: AlreadyExists means there), bounded by a
short timeout (the admission is waiting), and never fatal: any failure is an answer saying why, and
the pods then do not consume a request that does not exist. A cluster that does not serve
autoscaling.x-k8s.io/v1 leaves no PodTemplate behind.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Sequence

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from ..objects.provisioning import GROUP, VERSION
from .shared_claims import describe

log = logging.getLogger(__name__)

CONFLICT, NOT_FOUND = 409, 404
# What `on_result` counts (topology_provisioning_requests_total's `result`; docs/reference/metrics.md
# is generated from it).
RESULTS: Mapping[str, str] = {
    "created": "a group that waits for nodes got its ProvisioningRequest (and PodTemplate)",
    "exists": "its ProvisioningRequest was there already (another replica, or an earlier admission)",
    "not-served": "the cluster does not serve autoscaling.x-k8s.io/v1: none made, no PodTemplate left behind",
    "failed": "a create or delete call failed; the admission goes on without it, the pods do not consume it",
    "deleted": "the workload was deleted: its ProvisioningRequest and PodTemplate too",
}
TIMEOUTS = (1.0, 2.0)  # connect, read: an admission has seconds, not minutes
PLURAL = "provisioningrequests"


class ApiScaleUps:
    """`ScaleUps` (webhook/state/index.py) through the API; `on_result` counts each outcome, one
    of RESULTS."""

    def __init__(self, api_client: k8s_client.ApiClient, on_result: Callable[[str], None] = lambda _: None) -> None:
        self.core = k8s_client.CoreV1Api(api_client)
        self.custom = k8s_client.CustomObjectsApi(api_client)
        self.on_result = on_result

    def create(self, objects: Sequence[Mapping]) -> str | None:
        pod_template, request = objects
        namespace, name = request["metadata"]["namespace"], request["metadata"]["name"]
        body: Any = dict(pod_template)  # the client sends dicts as they are
        try:
            self._call(lambda: self.core.create_namespaced_pod_template(namespace, body, _request_timeout=TIMEOUTS),
                       CONFLICT)
        except (ApiException, HTTPError, OSError) as err:
            return self._failed(namespace, name, err)
        try:
            existed = self._call(lambda: self.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, dict(request), _request_timeout=TIMEOUTS), CONFLICT)
        except ApiException as err:
            if err.status == NOT_FOUND:  # the PodTemplate was made; the request's API is not served
                try:
                    self._call(lambda: self.core.delete_namespaced_pod_template(
                        name, namespace, _request_timeout=TIMEOUTS), NOT_FOUND)
                except (ApiException, HTTPError, OSError) as cleanup:
                    log.warning("PodTemplate %s/%s left behind: %s", namespace, name, describe(cleanup))
                self.on_result("not-served")
                return f"the API {GROUP}/{VERSION} is not served"
            return self._failed(namespace, name, err)
        except (HTTPError, OSError) as err:
            return self._failed(namespace, name, err)
        self.on_result("exists" if existed else "created")
        return None

    def delete(self, namespace: str, name: str) -> None:
        try:
            self._call(lambda: self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _request_timeout=TIMEOUTS), NOT_FOUND)
            self._call(lambda: self.core.delete_namespaced_pod_template(name, namespace, _request_timeout=TIMEOUTS),
                       NOT_FOUND)
        except (ApiException, HTTPError, OSError) as err:
            self._failed(namespace, name, err)
            return
        self.on_result("deleted")

    @staticmethod
    def _call(call: Callable[[], object], tolerated: int) -> bool:
        """Make the call; True when it failed with the status `tolerated` (a create finding the
        object there already, a delete finding it gone)."""
        try:
            call()
        except ApiException as err:
            if err.status != tolerated:
                raise
            return True
        return False

    def _failed(self, namespace: str, name: str, err: BaseException) -> str:
        why = describe(err)
        log.warning("ProvisioningRequest %s/%s: %s", namespace, name, why)
        self.on_result("failed")
        return why
