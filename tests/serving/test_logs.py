"""Log lines: one per record, JSON with time and level (or escaped text), at the chosen level."""
import json
import logging

from webhook.cli import main
from webhook.serving import logs


def test_a_forged_name_stays_inside_its_one_json_line(capsys):
    logs.configure("json", "info")
    logging.getLogger("webhook.admission").info("admission placed", extra={logs.FIELDS: {
        "name": 'x"}\n{"level":"error","message":"forged'}})
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert entry["level"] == "info" and entry["name"].startswith('x"}\n{') and entry["time"].endswith("Z")


def test_text_format_escapes_newlines_in_messages_and_values(capsys):
    logs.configure("text", "info")
    logging.getLogger("webhook").warning("name %s", "a\nb", extra={logs.FIELDS: {"name": "c\nd"}})
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "WARNING webhook: name a\\nb" in lines[0] and 'name="c\\nd"' in lines[0]


def test_a_traceback_is_one_field_of_one_line(capsys):
    logs.configure("json", "info")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("webhook").exception("failed")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "RuntimeError: boom" in json.loads(lines[0])["exception"]


def test_log_level_drops_lines_below_it(capsys):
    code = main(["--log-level", "error", "certs", "--service", "Bad_Name", "--namespace", "x", "--out", "/tmp"])
    assert code == 2
    logging.getLogger("webhook").warning("hidden")
    logging.getLogger("webhook").error("shown")
    err = capsys.readouterr().err
    assert "hidden" not in err and "shown" in err


def test_serve_logs_json_by_default_and_text_on_request(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["serve", "--workers", "3"]) == 2
    entry = json.loads(capsys.readouterr().err)
    assert entry["level"] == "error" and "--workers 3" in entry["message"]
    assert main(["serve", "--workers", "3", "--log-format", "text"]) == 2
    assert capsys.readouterr().err.startswith("topology-webhook: error: --workers 3")
