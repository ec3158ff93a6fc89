"""report.md names the preflight that ran before the launch (train.yml passes it in summary['preflight'])."""
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.report import markdown

BASE = {"run_id": "r1", "status": "success", "problems": [], "hosts": {"worker1": [0]}}


def test_report_shows_preflight_bandwidth_and_threshold():
    summary = dict(BASE, preflight={"status": "pass", "warnings": ["clock on worker2: cannot confirm"],
                                    "bandwidth": {"label": "tcp", "status": "pass", "busbw_gbps": 0.6014,
                                                  "threshold_gbps": 0.0625, "link_gbps": 10.0}})
    text = markdown(summary, [])
    assert "Preflight: pass; all-reduce bus bandwidth 0.601 GB/s (tcp), threshold 0.062 GB/s of a 10 Gb/s link" in text
    assert "- warning: clock on worker2: cannot confirm" in text


def test_report_without_preflight_has_no_line():
    assert "Preflight" not in markdown(dict(BASE), [])
    assert "Preflight: pass (preflight.txt)." in markdown(dict(BASE, preflight={"status": "pass"}), [])
