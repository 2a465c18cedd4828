"""The chart's alert rules (charts/topology-webhook/files/alerts.yaml) checked and unit-tested by
Prometheus's own promtool (Debian's `prometheus` package; .ci/run installs it where it can): every
alert fires and stays silent in tests/fixtures/alerts_test.yaml, and links a runbook that exists."""
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from test_docs import anchors

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "charts" / "topology-webhook" / "files" / "alerts.yaml"
UNIT_TESTS = ROOT / "tests" / "fixtures" / "alerts_test.yaml"
RUNBOOK = ROOT / "docs" / "operations" / "troubleshooting.md"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (apt-get install prometheus)")


def alerts() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


@needs_promtool
def test_promtool_accepts_the_alert_rules():
    done = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout


@needs_promtool
def test_the_alerts_fire_as_their_unit_tests_say():
    done = subprocess.run([PROMTOOL, "test", "rules", UNIT_TESTS.name], cwd=UNIT_TESTS.parent,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_is_unit_tested_firing_and_silent():
    cases = [case for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    names = {alert["alert"] for alert in alerts()}
    assert {case["alertname"] for case in cases if case["exp_alerts"]} == names, "an alert never seen firing"
    assert {case["alertname"] for case in cases if not case["exp_alerts"]} == names, "an alert never seen silent"


def test_every_alert_links_its_runbook_in_the_troubleshooting_page():
    home = yaml.safe_load((RULES.parents[1] / "Chart.yaml").read_text())["home"]
    page = f"{home}/blob/main/{RUNBOOK.relative_to(ROOT)}#"
    for alert in alerts():
        url = alert["annotations"]["runbook_url"]
        assert url.startswith(page), url
        assert url.removeprefix(page) in anchors(RUNBOOK), f"{alert['alert']}: no heading #{url.removeprefix(page)}"
