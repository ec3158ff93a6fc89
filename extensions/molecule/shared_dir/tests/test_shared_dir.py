"""Nodes that share /shared pass; a node with a /shared of its own is named."""
import os
import subprocess
from pathlib import Path

import testinfra

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
# podman exec straight into the nodes (much faster than an ansible run per command).
testinfra_hosts = ["podman://mndsm-shared-coord", "podman://mndsm-shared-worker1"]


def test_runs_directory_and_probe_are_shared(host):
    runs = host.file("/shared/runs")
    assert runs.is_directory and runs.mode == 0o755
    token = host.file("/shared/.multinode-deepspeed-probe").content_string
    other = "mndsm-shared-worker1" if host.backend.get_hostname() == "mndsm-shared-coord" else "mndsm-shared-coord"
    # A file written on this node is seen on the other one.
    name = "/shared/written-by-%s" % host.backend.get_hostname()
    host.run("echo %s > %s", host.backend.get_hostname(), name)
    seen = testinfra.get_host("podman://%s" % other).run("cat %s", name)
    assert seen.stdout.strip() == host.backend.get_hostname()
    assert token.strip()


def test_a_node_with_its_own_directory_is_refused(host):
    if host.backend.get_hostname() != "mndsm-shared-coord":
        return
    playbook = Path(__file__).resolve().parents[1] / "all.yml"
    proc = subprocess.run(["ansible-playbook", "-i", INVENTORY, str(playbook)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, check=False)
    assert proc.returncode != 0
    # Whichever node wrote the probe, the loner is on the other side of it.
    assert "/shared is not the directory that" in proc.stdout, proc.stdout[-2000:]
    assert "mndsm-shared-loner" in proc.stdout.split("is not the directory that", 1)[1][:80] or \
        "mndsm-shared-loner: /shared is not" in proc.stdout
    assert "Fix: mount the same shared filesystem" in proc.stdout
