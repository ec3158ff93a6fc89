"""The benchmark role's systemd units and command, rendered and checked by systemd's own tools (issue 6).

The local cluster's containers have no systemd, so the e2e test takes the cron path; these units are
verified here with systemd-analyze instead.
"""
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest

ROLE = Path(__file__).resolve().parents[3] / "roles" / "benchmark"
VARS = {"ansible_managed": "Ansible managed", "benchmark_user": "root", "benchmark_schedule_command": "/bin/true",
        "benchmark_schedule_log": "/tmp/bench/schedule.log", "benchmark_schedule_time": "07:05",
        "benchmark_hour": "7", "benchmark_minute": "5", "benchmark_config": {"timeout_s": 1800},
        "benchmark_dir": "/shared/bench", "benchmark_venv": "/opt/venv",
        "benchmark_schedule_config": "/etc/multinode-deepspeed/benchmark.json"}


def render(name, **kw):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(ROLE / "templates")), keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)
    return env.get_template(name).render(**dict(VARS, **kw))


def test_timer_fires_daily_at_the_configured_time():
    timer = render("multinode-benchmark.timer.j2")
    assert "OnCalendar=*-*-* 07:05:00" in timer and "Persistent=true" in timer
    service = render("multinode-benchmark.service.j2")
    assert "Type=oneshot" in service and "ExecStart=/bin/true" in service and "TimeoutStartSec=2100" in service
    # No log file opened by systemd (as root) in the benchmark's directory: the journal keeps the output.
    assert "StandardOutput" not in service and "/shared/bench" not in service


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_units_pass_systemd_analyze(tmp_path):
    for name in ("multinode-benchmark.service", "multinode-benchmark.timer"):
        (tmp_path / name).write_text(render(name + ".j2"))
    res = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "multinode-benchmark.timer"),
                          str(tmp_path / "multinode-benchmark.service")], capture_output=True, text=True, check=False)
    problems = [line for line in (res.stdout + res.stderr).splitlines() if "multinode-benchmark" in line]
    assert res.returncode == 0 and not problems, res.stdout + res.stderr
    spec = next(x.split("=", 1)[1] for x in render("multinode-benchmark.timer.j2").splitlines()
                if x.startswith("OnCalendar="))
    cal = subprocess.run(["systemd-analyze", "calendar", spec], capture_output=True, text=True, check=False)
    assert cal.returncode == 0 and "Normalized form: *-*-* 07:05:00" in cal.stdout, cal.stdout + cal.stderr


def test_the_command_runs_the_driver_with_the_schedules_settings(tmp_path):
    script = render("multinode-benchmark.j2")
    assert script.startswith("#!/bin/sh\n")
    assert ("exec /opt/venv/bin/python -m multinode_ds.bench run --config /etc/multinode-deepspeed/benchmark.json"
            " --trigger schedule \"$@\"") in script
    path = tmp_path / "cmd"
    path.write_text(script)
    assert subprocess.run(["sh", "-n", str(path)], check=False).returncode == 0
    other = render("multinode-benchmark.j2", benchmark_user="deepspeed")
    assert 'if [ "$(id -un)" != "deepspeed" ]' in other
    path.write_text(other)
    assert subprocess.run(["sh", "-n", str(path)], check=False).returncode == 0
