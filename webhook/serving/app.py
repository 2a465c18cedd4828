"""The Flask app: /mutate for the apiserver, /healthz and /readyz (/metrics has its own port:
see metrics_port.start_metrics_server).

Two error channels, decided here: a call that is not an AdmissionReview gets an HTTP 4xx with a
one-line reason; anything that goes wrong inside us while handling a real review is answered
200 allowed-unmodified with a warning (fail open), logged and counted. A 500 is never sent: the
apiserver would apply the webhook's failurePolicy to it, and `Fail` would block every workload.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Mapping

import orjson
from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from .. import admission
from ..settings.config import Config
from ..state.index import ClusterIndex
from .logs import FIELDS
from .metrics import Metrics
from ..admission.recent import RecentDecisions
from .paths import HEALTHZ_PATH, MUTATE_PATH, READYZ_PATH

Readiness = Callable[[], "tuple[bool, str]"]
log = logging.getLogger("webhook.admission")
# Why a request to /mutate was answered 4xx (topology_admission_rejected_requests_total's `reason`;
# docs/reference/metrics.md is generated from it).
REJECTED_REASONS: Mapping[str, str] = {
    "not_json": "400: the body is not JSON this server can read",
    "not_json_type": "415: Content-Type is not application/json",
    "not_a_review": "400: JSON, but not an AdmissionReview (or one without request.uid)",
    "too_large": "413: the body is larger than `max_body_bytes`",
    "http_<code>": "any other 4xx the HTTP layer answered (http_404, http_405...)",
}


def _text(message: str, status: int) -> Response:
    return Response(message + "\n", status=status, mimetype="text/plain")


def _allowed_unmodified(body: Any, warning: str) -> dict | None:
    """The fail-open answer in the version received, or None when the body has no request uid."""
    request_part = body.get("request") if isinstance(body, dict) else None
    uid = request_part.get("uid") if isinstance(request_part, dict) else None
    if not isinstance(uid, str):
        return None
    return {"apiVersion": body.get("apiVersion"), "kind": "AdmissionReview",
            "response": {"uid": uid, "allowed": True, "warnings": [warning]}}


def _log_fields(result: admission.AdmissionResult, seconds: float) -> dict:
    """What one admission's log line says: the object and the decision, never the object itself
    (env carries secrets). The formatter escapes the values: a name cannot break the line."""
    decision = result.decision
    entry = {"uid": result.uid, "kind": result.kind, "namespace": result.namespace, "name": result.name,
             "outcome": result.outcome, "strategy": result.strategy,
             "domain": str(decision.scope) if decision is not None and decision.scope is not None else None,
             "code": decision.code if decision is not None else None,
             "warnings": len(result.warnings), "duration_ms": round(seconds * 1000, 3)}
    if result.error:
        entry["error"] = result.error
    return entry


def _body(limit: int) -> bytes | None:
    """The request body, or None when a chunked one runs past `limit` bytes."""
    if request.content_length is not None:
        return request.get_data()
    data = request.environ["wsgi.input"].read(limit + 1)  # the server ends the stream at the last chunk
    return None if len(data) > limit else data


def create_app(config: Config, index: ClusterIndex, readiness: Readiness, metrics: Metrics | None = None,
               decisions: RecentDecisions | None = None) -> Flask:
    """The webhook app over one cluster view (a ClusterIndex) and its readiness check.

    metrics defaults to single-process metrics; the server passes multiprocess ones when it
    runs several workers. `decisions` records each admission for the topology page.
    """
    metrics = metrics or Metrics.create()
    metrics.watch_cluster(index.stats)
    app = Flask(__name__)
    # Werkzeug refuses a longer declared Content-Length with 413 before reading the body; a chunked
    # body it silently cuts at the limit, so mutate() reads that one itself (see _body).
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes

    def refuse(reason: str, message: str, status: int) -> Response:
        """A 4xx answer, counted by reason (a client or proxy sending the wrong thing shows here)."""
        metrics.rejected.labels(reason).inc()
        return _text(message, status)

    @app.errorhandler(HTTPException)
    def http_error(err: HTTPException) -> Response:
        return refuse(f"http_{err.code or 400}", f"{err.code} {err.name}: {err.description}", err.code or 400)

    @app.post(MUTATE_PATH)
    def mutate() -> Response:
        # The apiserver appends ?timeout=Ns; our handling is far below any timeout, so it is not read.
        started = time.perf_counter()
        if request.content_length is not None and request.content_length > config.max_body_bytes:
            return refuse("too_large", f"request body of {request.content_length} bytes exceeds the limit of "
                          f"{config.max_body_bytes} bytes", 413)
        if request.mimetype != "application/json":
            return refuse("not_json_type", f"Content-Type must be application/json, got "
                          f"{request.mimetype[:60] or 'none'!r}", 415)
        data = _body(config.max_body_bytes)
        if data is None:
            return refuse("too_large", f"chunked request body exceeds the limit of {config.max_body_bytes} bytes", 413)
        try:  # orjson: a third of json's time to decode a review, a seventh to encode the answer
            body = orjson.loads(data)
        except ValueError as err:  # orjson.JSONDecodeError: not UTF-8, not JSON, nested past 1,024 levels
            return refuse("not_json", f"request body is not JSON: {err}", 400)
        try:
            result = admission.review(body, index, config, readiness())
        except admission.MalformedReview as err:
            return refuse("not_a_review", f"not an AdmissionReview: {err}", 400)
        except Exception as err:  # a bug of ours must not block the cluster's workloads
            log.exception("admission failed; allowing unmodified")
            metrics.fail_open.inc()
            # The type only: a message may quote the object, and a newline would make the apiserver drop it.
            answer = _allowed_unmodified(body, f"topology-webhook: internal error ({type(err).__name__}); "
                                               "admitted without placement")
            if answer is None:
                return refuse("not_a_review", "not an AdmissionReview: request.uid is missing", 400)
            return Response(orjson.dumps(answer), mimetype="application/json")
        seconds = time.perf_counter() - started
        metrics.record_admission(result.kind, result.strategy, result.outcome, seconds)
        if decisions is not None:
            decisions.record(result, time.time())
        log.info("admission %s", result.outcome, extra={FIELDS: _log_fields(result, seconds)})
        return Response(orjson.dumps(result.review), mimetype="application/json")

    @app.get(HEALTHZ_PATH)
    def healthz() -> Response:
        return _text("ok", 200)

    @app.get(READYZ_PATH)
    def readyz() -> Response:
        ready, reason = readiness()
        return _text("ok" if ready else f"not ready: {reason}", 200 if ready else 503)

    return app
