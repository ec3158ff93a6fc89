"""The export is limited to the cluster, squashes root, is sync; clients mount hard with _netdev."""
import json
import os
import subprocess
from pathlib import Path

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
# podman exec straight into the nodes (much faster than an ansible run per command).
testinfra_hosts = ["podman://mndsm-nfs-coord", "podman://mndsm-nfs-worker1", "podman://mndsm-nfs-worker2"]
SERVER = "mndsm-nfs-coord"
EXPORTS = "/etc/exports.d/multinode-deepspeed.exports"
OPTIONS = "rw,sync,root_squash,no_subtree_check"


def worker_ips(host):
    ips = []
    for name in ("mndsm-nfs-worker1", "mndsm-nfs-worker2"):
        res = host.run("getent ahostsv4 %s", name)
        assert res.rc == 0, res.stderr
        ips.append(res.stdout.split()[0])
    return ips


def test_server_exports_to_the_workers_only(host):
    if host.backend.get_hostname() != SERVER:
        return
    assert host.package("nfs-kernel-server").is_installed
    export = host.file("/srv/multinode-deepspeed")
    assert export.is_directory and export.mode == 0o755 and export.user == "deepspeed"
    lines = [line for line in host.file(EXPORTS).content_string.splitlines() if line and not line.startswith("#")]
    assert len(lines) == 1
    path, *clients = lines[0].split()
    assert path == "/srv/multinode-deepspeed"
    assert sorted(clients) == sorted("%s(%s)" % (ip, OPTIONS) for ip in worker_ips(host))
    assert "*" not in lines[0] and "no_root_squash" not in lines[0] and "async" not in lines[0]


def test_clients_mount_hard_with_netdev(host):
    if host.backend.get_hostname() == SERVER:
        assert not host.file(EXPORTS).content_string == ""
        return
    assert host.package("nfs-common").is_installed
    entries = [line.split() for line in host.file("/etc/fstab").content_string.splitlines()
               if "/srv/multinode-deepspeed" in line]
    assert len(entries) == 1, entries
    src, path, fstype, opts = entries[0][:4]
    assert src == "mndsm-nfs-coord:/srv/multinode-deepspeed" and path == "/srv/multinode-deepspeed"
    assert fstype == "nfs"
    assert {"hard", "_netdev", "rw"} <= set(opts.split(","))


def test_unsafe_settings_are_refused_before_any_change(host):
    if host.backend.get_hostname() != SERVER:
        return
    before = host.file(EXPORTS).content_string
    playbook = Path(__file__).resolve().parents[1] / "bad.yml"
    # Judged by meaning (issue 26): a wildcard, a network wider than the cluster, a squash undone by anonuid=0,
    # an option smuggled in a client's name.
    for extra, words in (({"nfs_export_clients": ["*"]}, "* names hosts by a pattern or netgroup"),
                         ({"nfs_export_clients": ["*.example.org"]}, "names hosts by a pattern or netgroup"),
                         ({"nfs_export_clients": ["10.0.0.0/8"]}, "wider than the cluster"),
                         ({"nfs_export_clients": ["10.0.0.1(rw,no_root_squash)"]}, "is not an address, a network"),
                         ({"nfs_export_options": ["rw", "sync", "no_root_squash"]}, "no_root_squash - root on every"),
                         ({"nfs_export_options": ["rw", "sync", "root_squash", "anonuid=0"]},
                          "anonuid=0 is not a plain id from 1 to"),
                         ({"nfs_export_options": ["rw", "sync", "root_squash", "anonuid=-0"]},
                          "anonuid=-0 is not a plain id from 1 to"),
                         ({"nfs_server_host": "nfs9"}, "nfs_server_host=nfs9 is not in the inventory"),
                         ({"ssh_mesh_user": "root"}, "nfs_export_owner: root")):
        proc = subprocess.run(["ansible-playbook", "-i", INVENTORY, str(playbook), "-e", json.dumps(extra)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
        assert proc.returncode != 0, proc.stdout
        assert words in proc.stdout and "Fix:" in proc.stdout, proc.stdout[-2000:]
    assert host.file(EXPORTS).content_string == before
