"""The cluster's answers for the metrics port's access checks (serving/access.py decides with them):
a TokenReview (authentication.k8s.io/v1) says whose a bearer token is, a SubjectAccessReview
(authorization.k8s.io/v1) whether that user may get a non-resource URL or list pods in a
namespace. The webhook's ServiceAccount needs `create` on both (the chart's ClusterRole).

Thin on purpose: one request each, raw JSON both ways (dict bodies, _preload_content=False), on a
client of its own without retries, so a slow API costs a reader REVIEW_TIMEOUT_SECONDS at most.
"""
from __future__ import annotations

import copy
import json
from typing import Any, Callable

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from ..credentials.access import Access, NonResourceURL, Question, Reader, ReviewError

REVIEW_TIMEOUT_SECONDS = 5.0


def _answer(what: str, call: Callable[..., Any], body: dict) -> dict:
    try:
        response = call(body, _preload_content=False, _request_timeout=REVIEW_TIMEOUT_SECONDS)
        return json.loads(response.data)
    except ApiException as err:
        hint = " (the webhook's ServiceAccount needs create on it: the chart's ClusterRole)" if err.status == 403 else ""
        raise ReviewError(f"{what}: HTTP {err.status} {str(err.reason or '').strip()}{hint}") from None
    except (HTTPError, OSError, ValueError) as err:
        raise ReviewError(f"{what}: the API server cannot be reached ({type(err).__name__})") from None


def _own_client(api_client: k8s_client.ApiClient) -> k8s_client.ApiClient:
    configuration = copy.deepcopy(api_client.configuration)
    configuration.retries = False  # a reader waits for one answer, not three
    return k8s_client.ApiClient(configuration)


def token_reviewer(api_client: k8s_client.ApiClient) -> Callable[[str], Reader | None]:
    """review(token): the Reader a TokenReview names, or None when the cluster does not accept the
    token. The default audience (the API server's), as kube-rbac-proxy without --auth-token-audiences."""
    api: Any = k8s_client.AuthenticationV1Api(_own_client(api_client))

    def review(token: str) -> Reader | None:
        answer = _answer("TokenReview", api.create_token_review, {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}})
        status = answer.get("status") or {}
        if not status.get("authenticated"):
            return None
        user = status.get("user") or {}
        extra = tuple(sorted((str(key), tuple(map(str, values or ()))) for key, values in (user.get("extra") or {}).items()))
        return Reader(str(user.get("username") or ""), str(user.get("uid") or ""),
                      tuple(map(str, user.get("groups") or ())), extra)

    return review


def subject_access_review(reader: Reader, question: Question) -> dict:
    """The SubjectAccessReview asking whether `reader` may do `question`."""
    spec: dict[str, Any] = {"user": reader.name, "groups": list(reader.groups)}
    if reader.uid:
        spec["uid"] = reader.uid
    if reader.extra:
        spec["extra"] = {key: list(values) for key, values in reader.extra}
    if isinstance(question, NonResourceURL):
        spec["nonResourceAttributes"] = {"path": question.path, "verb": question.verb}
    else:
        spec["resourceAttributes"] = {"namespace": question.namespace, "verb": question.verb,
                                      "resource": question.resource, "group": question.group}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


def authorizer(api_client: k8s_client.ApiClient) -> Callable[[Reader, Question], bool]:
    """authorize(reader, question): whether a SubjectAccessReview allows it."""
    api: Any = k8s_client.AuthorizationV1Api(_own_client(api_client))

    def authorize(reader: Reader, question: Question) -> bool:
        answer = _answer("SubjectAccessReview", api.create_subject_access_review, subject_access_review(reader, question))
        return (answer.get("status") or {}).get("allowed") is True

    return authorize


def cluster_access(api_client: k8s_client.ApiClient, on_failure: Callable[[str], None]) -> Access:
    """The metrics port's access checks, asking this cluster."""
    return Access(token_reviewer(api_client), authorizer(api_client), on_failure=on_failure)

