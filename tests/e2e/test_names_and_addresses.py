"""Names and addresses on the local cluster: fixed addresses across restarts and reconnects, the
cluster_hosts role where DNS does not know the inventory names, and inventory names (not the
machines' hostnames) in everything a run reports."""
import json
import re
import time
from pathlib import Path

import pytest
from e2e_nodes import CLUSTER_DIR, INVENTORY, PREFIX, node_name
import yaml

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
HOSTS_PLAY = str(ROOT / "tests" / "e2e" / "files" / "cluster_hosts.yml")
ALIASES = {"worker1": "gpu-a1", "worker2": "gpu-a2"}


def addresses():
    inv = yaml.safe_load(INVENTORY.read_text())["all"]["children"]
    return dict((h, v["ansible_host"]) for g in inv.values() for h, v in g["hosts"].items())


def test_restarted_and_reconnected_node_keeps_its_address(provisioned, podman, localcluster, run_playbook):
    before, known = addresses(), (CLUSTER_DIR / "known_hosts").read_text()
    assert podman("stop", "-t", "2", node_name("worker2")).returncode == 0
    t0 = time.time()
    res = localcluster("up")
    assert res.returncode == 0, res.stderr
    print(f"worker2 restarted and checked in {time.time() - t0:.1f}s")
    assert "started %s again (address %s kept)" % (node_name("worker2"), before["worker2"]) in res.stderr
    assert "every node resolves coord, worker1, worker2 to its fixed address" in res.stderr
    assert addresses() == before and (CLUSTER_DIR / "known_hosts").read_text() == known
    # A network cut and its repair (the fault tests' tool) keep it too.
    try:
        assert localcluster("disconnect", "worker2").returncode == 0
        cut = localcluster("check", "--settle", "0")
        assert cut.returncode != 0 and "worker2" in cut.stderr and "Fix:" in cut.stderr
    finally:
        assert localcluster("connect", "worker2").returncode == 0
    res = localcluster("check")
    assert res.returncode == 0, res.stderr
    inspect = podman("inspect", "-f", '{{(index .NetworkSettings.Networks "%s-net").IPAddress}}' % PREFIX, node_name("worker2"))
    assert inspect.stdout.strip() == before["worker2"]
    # Whatever the container runtime did to worker2's /etc/hosts at its restart, the role's block is there
    # afterwards, and Ansible reaches every node at the old address with the old host keys.
    res = run_playbook(HOSTS_PLAY, name="cluster-hosts-restore")
    assert res.rc == 0, res.tail()
    assert res.recap()["worker1"]["changed"] == 0, res.recap()
    hosts = podman("exec", node_name("worker2"), "cat", "/etc/hosts").stdout
    assert hosts.startswith("# BEGIN multinode-deepspeed cluster names\n"), hosts
    assert f"{before['worker2']} worker2\n" in hosts


def alias_inventory(tmp_path, hosts_file):
    """The local cluster under other inventory names (gpu-a1, gpu-a2): names the podman DNS does not know."""
    text = INVENTORY.read_text()
    for machine, alias in ALIASES.items():
        text = re.sub(r"(?m)^(\s+)%s:$" % machine, r"\1%s:" % alias, text)
    text = text.replace("  vars:\n", "  vars:\n    cluster_hosts_file: %s\n" % str(hosts_file).lower(), 1)
    path = tmp_path / ("hosts-%s.yml" % ("on" if hosts_file else "off"))
    path.write_text(text)
    return path


def names_verdicts(out):
    """The names verdicts of the preflight whose output this is (it prints "Preflight <run id>: PASS|FAIL")."""
    run_id = re.findall(r"Preflight (preflight-[0-9-]+): (?:PASS|FAIL|WARN)", out)[-1]
    report = json.loads((ROOT / "runs" / run_id / "preflight.json").read_text())
    return dict((v["host"], v) for v in report["verdicts"] if v["check"] == "names")


def test_names_without_dns_come_from_the_cluster_hosts_role(provisioned, run_playbook, podman, tmp_path):
    off, on = alias_inventory(tmp_path, False), alias_inventory(tmp_path, True)
    try:
        # The inventory says cluster_hosts_file: false (the site's DNS names the nodes); here it does not.
        res = run_playbook(HOSTS_PLAY, inventory=off, name="cluster-hosts-off")
        assert res.rc == 0, res.tail()
        assert "multinode-deepspeed cluster names" not in podman("exec", node_name("coord"), "cat", "/etc/hosts").stdout
        res = run_playbook("preflight.yml", "-e", "backend=ssh-free", inventory=off, name="preflight-names-off")
        assert res.rc != 0
        verdicts = names_verdicts(res.out)
        assert verdicts["coord"]["status"] == "fail", verdicts
        assert "gpu-a1 does not resolve" in verdicts["coord"]["detail"]
        assert verdicts["coord"]["fix"].startswith("cluster_hosts_file is false for coord")
        assert "names on gpu-a2: gpu-a1 does not resolve" in res.out and "cluster_hosts_file" in res.out

        # The role on (the default): every node resolves gpu-a1 and gpu-a2 from /etc/hosts.
        res = run_playbook(HOSTS_PLAY, inventory=on, name="cluster-hosts-on")
        assert res.rc == 0, res.tail()
        hosts = podman("exec", node_name("worker1"), "getent", "hosts", "gpu-a2").stdout.split()
        assert hosts[:2] == [addresses()["worker2"], "gpu-a2"], hosts
        res = run_playbook("preflight.yml", "-e", "backend=ssh-free", inventory=on, name="preflight-names-on")
        verdicts = names_verdicts(res.out)
        assert all(v["status"] == "pass" for v in verdicts.values()), verdicts
        assert verdicts["gpu-a1"]["detail"] == "resolves coord, gpu-a1, gpu-a2"
        assert res.rc == 0, res.tail()

        # A run under those names reports them, not the machines' hostnames (worker1, worker2).
        run_id = f"e2e-names-train-{int(time.time())}"
        res = run_playbook("train.yml", "-e", "backend=ssh-free", "-e", "preflight=false", "-e", "steps=5",
                           "-e", f"run_id={run_id}", inventory=on, name="train-inventory-names")
        assert res.rc == 0, res.tail()
        run = ROOT / "runs" / run_id
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "success", summary["problems"]
        assert summary["hosts"] == {"gpu-a1": [0], "gpu-a2": [1]}, summary["hosts"]
        assert {r["host"] for r in summary["ranks"].values()} == {"gpu-a1", "gpu-a2"}
        assert set(summary["nodes"]) == {"gpu-a1", "gpu-a2"}
        for rank, alias in ((0, "gpu-a1"), (1, "gpu-a2")):
            recs = [json.loads(x) for x in (run / "metrics" / f"rank{rank}.jsonl").read_text().splitlines()]
            assert {r["host"] for r in recs if "host" in r} == {alias}
        assert re.search(r"nodes: gpu-a1 \w+ \d+s, gpu-a2", res.out), "progress lines name the inventory hosts"
        assert "world size 2 on gpu-a1 ranks [0], gpu-a2 ranks [1]" in res.out
        report = (run / "report.md").read_text()
        assert "gpu-a1" in report and "worker1" not in report
    finally:
        # Back to the cluster's own names.
        assert run_playbook(HOSTS_PLAY, name="cluster-hosts-back").rc == 0
