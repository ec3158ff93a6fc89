"""The NFS export judged by what it means (issue 26, point 5): the spellings a string match lets through are
refused, the cluster's own settings pass."""
import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.nfs import export_problems

from ansible_collections.multinode.deepspeed.plugins.filter.nfs_export_problems import FilterModule

SAFE = {"clients": ["10.89.0.11", "10.89.0.12"], "options": ["rw", "sync", "root_squash", "no_subtree_check"],
        "mount_options": ["rw", "hard", "_netdev", "nfsvers=4.2", "noatime"], "owner": "deepspeed"}


def problems(**changes):
    return export_problems(dict(SAFE, **changes))


def test_the_roles_defaults_pass():
    assert problems() == []
    assert problems(clients=["10.0.0.0/24", "fd00::/64", "gpu1.example.org", "10.1.0.0/16"]) == []
    assert problems(options=["rw", "sync", "all_squash", "anonuid=2000", "anongid=2000"]) == []


@pytest.mark.parametrize("client", ["10.0.0.0/8", "0.0.0.0/1", "128.0.0.0/1", "172.16.0.0/12", "10.1.2.3/8",
                                    "::/1", "fd00::/8"])
def test_networks_wider_than_the_cluster_are_refused_unless_allowed(client):
    found = problems(clients=[client])
    assert len(found) == 1 and "wider than the cluster" in found[0] and "nfs_export_allow_wide" in found[0]
    assert problems(clients=[client], allow_wide=True) == []


@pytest.mark.parametrize("client", ["*", "*.example.org", "gpu?.lab", "node[1-4]", "@trusted"])
def test_wildcards_and_netgroups_are_refused_unless_allowed(client):
    found = problems(clients=[client])
    assert len(found) == 1 and "pattern or netgroup" in found[0]
    assert problems(clients=[client], allow_wide=True) == []


@pytest.mark.parametrize("client", ["10.0.0.1(rw,no_root_squash)", "10.0.0.1 *", "a;b", "", "10.0.0.1/33"])
def test_a_client_that_would_smuggle_options_or_hosts_is_refused(client):
    found = problems(clients=[client])
    assert len(found) == 1 and "is not an address, a network or a host name" in found[0]
    assert problems(clients=[client], allow_wide=True) == found


@pytest.mark.parametrize("option, word", [("no_root_squash", "root on every client"), (" NO_ROOT_SQUASH", "root"),
                                          ("insecure", "unprivileged port"), ("async", "on disk"),
                                          ("anonuid=0", "root's id"), ("anongid=00", "root's id"),
                                          ("anonuid=-0", "root's id"), ("anongid=-0", "root's id"),
                                          ("anonuid=4294967296", "root's id"), ("anongid=4294967295", "root's id"),
                                          ("anonuid=-1", "root's id"), ("anonuid=0x10", "not a plain id"),
                                          ("no_auth_nlm", "locks"), ("insecure_locks", "locks")])
def test_options_that_undo_the_protection_are_refused_however_spelled(option, word):
    found = problems(options=SAFE["options"] + [option])
    assert len(found) == 1 and word in found[0] and "Fix:" in found[0]


def test_anon_ids_kept_are_the_plain_non_root_ones():
    assert problems(options=SAFE["options"] + ["anonuid=1", "anongid=65534", "anonuid=4294967294"]) == []


def test_missing_sync_or_squash_and_odd_options():
    found = problems(options=["rw", "rw,no_root_squash"])
    assert [f.split(":")[0] for f in found] == ["nfs_export_options"] * 3
    assert "not an export option" in found[0] and "no sync" in found[1] and "root_squash" in found[2]


def test_mount_options_and_owner():
    assert "soft" in problems(mount_options=["soft", "hard", "_netdev"])[0]
    assert "no hard" in problems(mount_options=["_netdev"])[0]
    assert "_netdev" in problems(mount_options=["hard"])[0]
    assert "nfs_export_owner: root" in problems(owner="root")[0]


def test_no_client_and_every_problem_at_once():
    found = export_problems({"clients": [], "options": ["async"], "mount_options": [], "owner": "root"})
    assert found[0].startswith("nfs_export_clients: no client") and len(found) == 7


def test_the_filter_is_the_function():
    assert FilterModule().filters()["nfs_export_problems"](SAFE) == []
