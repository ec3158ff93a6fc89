"""End to end on the local cluster: provision, prove idempotence, train across two workers."""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_nodes import INVENTORY, node_name


pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def podman_exec(node, *cmd):
    env = {"CONTAINERS_CONF": str(ROOT / ".cache" / "podman" / "containers.conf"), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["podman", "exec", node_name(node), *cmd], env=env, capture_output=True, text=True, check=False)


def version_rows(out):
    """host -> columns of the version table that site.yml prints."""
    block = out[out.index("TASK [Print the version table]"):]
    lines = re.findall(r"^\s+- '(.*)'$", block, re.M)
    header = lines[0].split()
    assert header[:4] == ["host", "role", "gpus", "python"], header
    rows = {}
    for line in lines[1:]:
        parts = line.split()
        rows[parts[0]] = dict(zip(["role", "gpus"] + header[3:], parts[1:]))
    return rows


def test_site_prints_identical_versions(provisioned):
    rows = version_rows(provisioned.out)
    assert set(rows) == {"coord", "worker1", "worker2"}, rows
    keys = ["python", "torch", "cuda", "nccl", "deepspeed", "transformers", "trainer"]
    assert all([r[k] for k in keys] == [rows["coord"][k] for k in keys] for r in rows.values()), rows
    assert rows["worker1"]["torch"].startswith("2.13.0") and rows["worker1"]["deepspeed"] == "0.19.8"
    assert rows["worker1"]["cuda"] == "none" and rows["worker1"]["gpus"] == "-"
    assert rows["coord"]["role"] == "coord" and rows["worker2"]["role"] == "worker"
    # The stack chosen from the matrix, and the NCCL profile chosen from the fabric, were printed.
    assert re.search(r"worker1\s+3\.11\.\d+\s+cpu\s+-\s+-\s+2\.13\.0\+cpu\s+0\.19\.8", provisioned.out)
    assert "NCCL profile tcp on worker1, worker2" in " ".join(provisioned.out.split())


def test_site_second_run_changes_nothing(provisioned, run_playbook):
    res = run_playbook("site.yml", name="site-second")
    assert res.rc == 0, res.tail()
    recap = res.recap()
    assert set(recap) >= {"coord", "worker1", "worker2"}, res.tail()
    changed = {h: r["changed"] for h, r in recap.items() if r["changed"]}
    assert changed == {}, f"second site.yml run changed {changed}; log {res.log}"


def test_ssh_mesh_is_real_and_strict(provisioned):
    # As the run's non-root account (site.yml made it): pdsh from the coordinator to every worker and to itself,
    # with host keys checked.
    res = podman_exec("coord", "su", "-s", "/bin/sh", "deepspeed", "-c", "pdsh -R ssh -w coord,worker1,worker2 hostname")
    assert res.returncode == 0, res.stderr
    assert sorted(line.split(": ")[1] for line in res.stdout.splitlines()) == ["coord", "worker1", "worker2"]
    cfg = podman_exec("coord", "cat", "/home/deepspeed/.ssh/config").stdout
    assert "StrictHostKeyChecking yes" in cfg and "StrictHostKeyChecking no" not in cfg
    # The coordinator's own key, authorized on a worker from the coordinator's addresses only.
    keys = podman_exec("worker1", "cat", "/home/deepspeed/.ssh/authorized_keys").stdout
    assert re.search(r'^from="[0-9.,:]+" ssh-ed25519 \S+ multinode-deepspeed local coord$', keys, re.M), keys
    assert "multinode-deepspeed local worker" not in keys
    # A worker holds no cluster key and logs in nowhere: an unknown host key is refused, a login has no key.
    assert podman_exec("worker1", "ls", "/home/deepspeed/.ssh/id_ed25519_local").returncode != 0
    res = podman_exec("worker1", "su", "-s", "/bin/sh", "deepspeed", "-c",
                      "ssh -o BatchMode=yes -o ConnectTimeout=5 worker2 true")
    assert res.returncode != 0 and "Permission denied" in res.stderr, res.stderr
    res = podman_exec("coord", "su", "-s", "/bin/sh", "deepspeed", "-c",
                      "ssh -o UserKnownHostsFile=/dev/null -o GlobalKnownHostsFile=/dev/null worker2 true")
    assert res.returncode != 0 and "Host key verification failed" in res.stderr


def test_train_two_workers(provisioned, run_playbook):
    run_id = f"e2e-{int(time.time())}"
    t0 = time.time()
    # preflight=force: the checks run now, whatever passing preflight an earlier test recorded.
    res = run_playbook("train.yml", "-e", "model=llama-tiny", "-e", "steps=30", "-e", f"run_id={run_id}",
                       "-e", "preflight=force", name="train")
    wall = time.time() - t0
    assert res.rc == 0, res.tail()
    run = ROOT / "runs" / run_id
    assert f"Summary: {run / 'summary.json'}" in res.out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "success", summary["problems"]
    assert summary["world_size"] == 2
    assert summary["hosts"] == {"worker1": [0], "worker2": [1]}, summary["hosts"]
    assert "coord" not in summary["hosts"]
    assert summary["steps"] == 30 and summary["last_step"] == 30
    assert summary["last_loss"] < summary["first_loss"], (summary["first_loss"], summary["last_loss"])
    assert summary["exit_status"] == 0
    assert (run / "hostfile").read_text() == "worker1 slots=1\nworker2 slots=1\n"
    # train.yml ran preflight first: its verdicts and the all-reduce test are in the run.
    preflight = json.loads((run / "preflight.json").read_text())
    assert preflight["status"] == "pass" and preflight["job"]["run_id"] == run_id
    assert (run / "preflight" / "allreduce-tcp.json").exists()
    assert res.out.index("busbw(GB/s)") < res.out.index("TASK [Start the agent")
    # Per-rank logs and metrics came back to the controller.
    assert len(list((run / "logs").glob("*_rank0.log"))) == 1
    assert len(list((run / "logs").glob("*_rank1.log"))) == 1
    for rank, host in ((0, "worker1"), (1, "worker2")):
        recs = [json.loads(x) for x in (run / "metrics" / f"rank{rank}.jsonl").read_text().splitlines()]
        steps = [r for r in recs if r["event"] == "step"]
        assert len(steps) == 30 and {r["host"] for r in steps} == {host}
        assert all(r["world_size"] == 2 for r in steps)
    log = (run / "nodes" / "coord.launcher.log").read_text()
    assert "Unable to find hostfile" not in log
    # pdsh prefixes every remote line with its host: ranks ran on both workers, none on the coordinator.
    assert re.search(r"(?m)^worker1: ", log) and re.search(r"(?m)^worker2: ", log)
    assert not re.search(r"(?m)^coord: ", log)
    # Nothing of the run is left on any node, and no rank ran on the coordinator.
    for node in ("coord", "worker1", "worker2"):
        ps = podman_exec(node, "pgrep", "-af", "multinode_ds.train").stdout
        assert ps.strip() == "", f"{node}: {ps}"
    print(f"train.yml wall time {wall:.0f}s, run {summary['wall_time']:.0f}s")


def test_empty_workers_group_fails_before_the_nodes_change(provisioned, run_playbook, tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  children:\n    coordinator:\n      hosts:\n        coord: {}\n    workers:\n      hosts: {}\n")
    res = run_playbook("site.yml", inventory=inv, name="empty-workers")
    assert res.rc != 0
    assert "workers group is empty or missing" in res.out
    assert "PLAY [Provision every node]" not in res.out


def test_installed_collection_trains(provisioned, run_playbook, tmp_path):
    """The tarball, installed into an empty collections path, runs multinode.deepspeed.train."""
    bin_dir = Path(sys.executable).parent
    subprocess.run([str(bin_dir / "ansible-galaxy"), "collection", "build", "--output-path", str(tmp_path)],
                   cwd=ROOT, check=True, capture_output=True)
    colls = tmp_path / "collections"
    # Away from the repo: a config whose only collections path is the empty one we install into.
    cfg = (ROOT / "ansible.cfg").read_text()
    cfg = re.sub(r"(?m)^collections_path = .*$", f"collections_path = {colls}", cfg)
    cfg = re.sub(r"(?m)^inventory = .*$", f"inventory = {provisioned_inventory()}", cfg)
    (tmp_path / "ansible.cfg").write_text(cfg)
    env = {"ANSIBLE_CONFIG": str(tmp_path / "ansible.cfg")}
    subprocess.run([str(bin_dir / "ansible-galaxy"), "collection", "install", "--no-deps", "-p", str(colls),
                    str(next(tmp_path.glob("multinode-deepspeed-*.tar.gz")))], cwd=tmp_path, check=True,
                   capture_output=True, env=dict(os.environ, **env))
    installed = colls / "ansible_collections" / "multinode" / "deepspeed"
    assert (installed / "playbooks" / "train.yml").exists()
    run_id = f"e2e-installed-{int(time.time())}"
    res = run_playbook("multinode.deepspeed.train", "-e", "steps=5", "-e", f"run_id={run_id}",
                       name="installed-train", env_extra=env, cwd=tmp_path)
    assert res.rc == 0, res.tail()
    # collect_dir defaults to runs/ under the directory ansible-playbook ran in.
    summary = json.loads((tmp_path / "runs" / run_id / "summary.json").read_text())
    assert summary["status"] == "success" and summary["world_size"] == 2 and summary["steps"] == 5


def provisioned_inventory():
    return INVENTORY
