"""The daily benchmark as the role installs it with cron, for a non-root account."""
import json

testinfra_hosts = ["podman://mndsm-bench-coord"]
COMMAND = "/opt/multinode-deepspeed/bin/multinode-benchmark"


def test_crontab_entry_at_the_configured_time(host):
    crontab = host.run("crontab -l -u bench")
    assert crontab.rc == 0, crontab.stderr
    assert "30 7 * * * %s >> /shared/bench/schedule.log 2>&1" % COMMAND in crontab.stdout.splitlines()
    assert host.run("crontab -l -u root").stdout.count("multinode-benchmark") == 0


def test_cron_runs(host):
    assert host.run("pgrep -x cron").rc == 0


def test_the_command_runs_the_driver_as_the_benchmark_account(host):
    cmd = host.file(COMMAND)
    assert cmd.is_file and cmd.mode == 0o755 and cmd.user == "root"
    assert "-m multinode_ds.bench run --config /etc/multinode-deepspeed/benchmark.json --trigger schedule" in \
        cmd.content_string
    res = host.run(COMMAND)           # as root: refused, naming the account
    assert res.rc == 2 and "run this as bench" in res.stderr


def test_settings_readable_only_by_the_benchmark_account(host):
    conf = host.file("/etc/multinode-deepspeed/benchmark.json")
    assert conf.user == "bench" and conf.mode == 0o600
    data = json.loads(conf.content_string)
    assert data["hosts"] == [["worker1", 1], ["worker2", 1]] and data["samples"] == 8
    bench_dir = host.file("/shared/bench")
    assert bench_dir.is_directory and bench_dir.user == "bench"


def test_no_systemd_units_without_systemd(host):
    assert not host.file("/etc/systemd/system/multinode-benchmark.timer").exists
