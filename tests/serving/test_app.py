"""The Flask app's two error channels, health endpoints, metrics and admission log lines."""
import json
import logging

import pytest
from conftest import assert_valid_kubernetes_object, patched_object, review_of

from tests.fixtures.builders import gpu_pod
from webhook import admission
from webhook.serving.app import create_app
from webhook.serving.logs import JsonFormatter
from webhook.serving.metrics import Metrics
from webhook.settings.config import Config


def post(client, body, content_type="application/json"):
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return client.post("/mutate?timeout=10s", data=data, content_type=content_type)


def one_line(response) -> str:
    text = response.get_data(as_text=True)
    assert text.count("\n") == 1 and text.endswith("\n"), text
    return text


def test_healthz_answers_ok(client):
    assert client.get("/healthz").status_code == 200


def test_readyz_reports_the_reason_while_not_ready(config, index):
    app = create_app(config, index, lambda: (False, "cluster view not loaded yet"), Metrics.create())
    response = app.test_client().get("/readyz")
    assert response.status_code == 503
    assert "cluster view not loaded yet" in one_line(response)


def test_readyz_answers_ok_when_ready(client):
    assert client.get("/readyz").status_code == 200


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_a_gpu_pod_review_is_answered_in_the_version_received_with_a_valid_patch(client, version):
    review = review_of(gpu_pod("trainer", 4, placement_strategy="consolidated"), version)
    response = post(client, review)
    assert response.status_code == 200
    mutated = patched_object(review, response.get_json())
    assert mutated != review["request"]["object"]
    assert_valid_kubernetes_object(mutated)


def test_body_that_is_not_json_gets_400_with_a_one_line_reason(client):
    response = post(client, "{not json")
    assert response.status_code == 400
    assert one_line(response).startswith("request body is not JSON")


def test_json_that_is_not_an_admission_review_gets_400(client):
    response = post(client, {"kind": "Pod", "apiVersion": "v1"})
    assert response.status_code == 400
    assert one_line(response).startswith("not an AdmissionReview")


def test_wrong_content_type_gets_415(client):
    response = post(client, json.dumps(review_of(gpu_pod("p", 1))), content_type="text/plain")
    assert response.status_code == 415
    assert "application/json" in one_line(response)


def test_oversized_body_is_refused_before_it_is_parsed(index):
    app = create_app(Config(max_body_bytes=1000), index, lambda: (True, ""), Metrics.create())
    response = post(app.test_client(), "x" * 1001)  # not JSON either: 413, not 400, proves the order
    assert response.status_code == 413
    assert "1001 bytes exceeds the limit of 1000 bytes" in one_line(response)


def test_unknown_path_and_method_get_one_line_answers(client):
    assert client.get("/nope").status_code == 404
    response = client.get("/mutate")
    assert response.status_code == 405
    one_line(response)


def test_an_internal_error_allows_unmodified_with_a_warning_and_is_counted(client, metrics, monkeypatch):
    def broken(*_args, **_kwargs):
        raise KeyError("boom")

    monkeypatch.setattr(admission, "review", broken)
    review = review_of(gpu_pod("trainer", 2))
    response = post(client, review)
    assert response.status_code == 200
    answer = response.get_json()
    assert answer["response"]["uid"] == review["request"]["uid"] and answer["response"]["allowed"]
    assert "patch" not in answer["response"]
    assert answer["response"]["warnings"] == ["topology-webhook: internal error (KeyError); admitted without placement"]
    assert "topology_admission_fail_open_total 1.0" in metrics.render()[0].decode()


def test_each_admission_logs_one_json_line_without_the_object(client, caplog):
    pod = gpu_pod("trainer", 2)
    pod["spec"]["containers"][0]["env"] = [{"name": "WANDB_API_KEY", "value": "s3cr3t-token"}]
    review = review_of(pod)
    with caplog.at_level(logging.INFO, logger="webhook.admission"):
        post(client, review)
    records = [r for r in caplog.records if r.name == "webhook.admission"]
    assert len(records) == 1
    entry = json.loads(JsonFormatter().format(records[0]))
    assert entry["level"] == "info" and entry["time"].endswith("Z")
    assert entry["uid"] == review["request"]["uid"]
    assert (entry["kind"], entry["namespace"], entry["name"]) == ("Pod", "ml", "trainer")
    assert entry["duration_ms"] >= 0 and entry["outcome"]
    assert "s3cr3t-token" not in caplog.text


def test_metrics_count_decisions_and_show_cluster_gauges(client, metrics):
    post(client, review_of(gpu_pod("trainer", 4, placement_strategy="consolidated")))
    assert client.get("/metrics").status_code == 404  # its own port: metrics_port.start_metrics_server
    text = metrics.render()[0].decode()
    assert 'topology_placement_decisions_total{kind="Pod"' in text
    assert "topology_scheduler_latency_seconds_count 1.0" in text
    for gauge in ("topology_gpu_allocation_ratio", "topology_scheduler_domain_fragmentation_ratio",
                  'topology_domain_utilization_ratio{domain="'):
        assert gauge in text


def test_json_nested_too_deeply_gets_400_not_500(client):
    response = post(client, "[" * 100_000 + "]" * 100_000)
    assert response.status_code == 400
    one_line(response)
