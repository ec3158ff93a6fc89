"""Preflight's SSH check (module_utils/preflight/ssh.py): the pairs each backend needs, the fix named from
real OpenSSH errors, the verdicts and the matrix."""
import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.ssh import ssh_fix, ssh_matrix_table, ssh_required_pairs, ssh_verdicts

from tests.unit.plugins.module_utils.preflight.preflight_data import launch_of


def test_ssh_pairs_for_pdsh():
    assert ssh_required_pairs(launch_of("pdsh", ["coord"], ["w1", "w2"])) == [
        ("coord", "coord"), ("coord", "w1"), ("coord", "w2")]
    # The coordinator is a rank node too: no duplicate pair; a rank node logs in nowhere.
    assert ssh_required_pairs(launch_of("pdsh", ["w1"], ["w1", "w2"])) == [("w1", "w1"), ("w1", "w2")]


def test_ssh_pairs_for_ssh_free():
    assert ssh_required_pairs(launch_of("ssh-free", ["coord"], ["w1", "w2"])) == []


@pytest.mark.parametrize("src, dst, stderr, rc, want", [
    ("coord", "worker1", "ssh: connect to host worker1 port 22: Connection refused", 255,
     ["sshd is not running", "on worker1", "systemctl start ssh"]),
    ("coord", "worker1", "Host key verification failed.", 255,
     ["coord does not know worker1's host key", "ssh_mesh", "known_hosts", "never turn StrictHostKeyChecking off"]),
    ("coord", "worker2", "root@worker2: Permission denied (publickey).", 255,
     ["coord's cluster key is not accepted on worker2", "authorized_keys", "ssh_mesh_user"]),
    ("coord", "worker2", "ssh: Could not resolve hostname worker2: Name or service not known", 255,
     ["coord cannot resolve the name worker2", "/etc/hosts on coord"]),
    ("coord", "worker1", "ssh: connect to host worker1 port 22: Connection timed out", 255,
     ["coord cannot reach worker1 on port 22", "firewall"]),
    ("coord", "worker1", "Connection timed out during banner exchange", 255,
     ["coord cannot reach worker1 on port 22"]),
    ("coord", "worker1", "ssh: connect to host worker1 port 22: No route to host", 255,
     ["coord cannot reach worker1 on port 22"]),
    ("coord", "worker1", "ssh worker1: timed out after 15 s", 124, ["coord cannot reach worker1"]),
    ("coord", "worker1", "", 124, ["coord cannot reach worker1"]),
    ("coord", "worker1", "kex_exchange_identification: read: Connection reset by peer", 255,
     ["ssh from coord to worker1 failed (exit 255)", "ssh worker1 true on coord"]),
])
def test_ssh_fix_from_real_openssh_errors(src, dst, stderr, rc, want):
    fix = ssh_fix(src, dst, stderr, rc)
    for text in want:
        assert text in fix


def test_ssh_fix_causes_do_not_overlap():
    fixes = [ssh_fix("c", "w", e, 255) for e in (
        "ssh: connect to host w port 22: Connection refused", "Host key verification failed.",
        "root@w: Permission denied (publickey).", "ssh: Could not resolve hostname w: Name or service not known",
        "ssh: connect to host w port 22: Connection timed out", "something else")]
    assert len(set(fixes)) == len(fixes)


OK = {"rc": 0, "stdout": "unlimited", "stderr": ""}


def test_ssh_verdicts_pass_and_fail_with_fix():
    required = ssh_required_pairs(launch_of("pdsh", ["coord"], ["w1", "w2"]))
    refused = {"rc": 255, "stdout": "",
               "stderr": "Warning: Permanently added 'w2' (ED25519) to the list of known hosts.\n"
                         "ssh: connect to host w2 port 22: Connection refused\n"}
    results = {"coord": {"coord": OK, "w1": OK, "w2": refused}, "w1": {"w1": OK}, "w2": {"w2": OK}}
    res = ssh_verdicts(results, required, "pdsh")
    assert len(res) == 3 and all(v["check"] == "ssh" for v in res)
    failed = [v for v in res if v["status"] == "fail"]
    assert len(failed) == 1 and failed[0]["host"] == "coord"
    assert failed[0]["detail"] == "coord -> w2: ssh: connect to host w2 port 22: Connection refused"
    assert "sshd is not running" in failed[0]["fix"]
    assert [v["detail"] for v in res if v["status"] == "pass"] == ["coord -> coord", "coord -> w1"]


def test_ssh_verdicts_without_stderr_name_the_exit_code():
    res = ssh_verdicts({"w1": {"w1": {"rc": 1, "stderr": ""}}}, [("w1", "w1")], "pdsh")
    assert res[0]["status"] == "fail" and res[0]["detail"] == "w1 -> w1: exit 1"


def test_ssh_verdicts_missing_source_fails():
    res = ssh_verdicts({"coord": {"w1": OK}}, [("coord", "w1"), ("w1", "w1")], "pdsh")
    assert res[0]["status"] == "pass"
    assert res[1]["status"] == "fail" and "not tested (w1 gave no answer)" in res[1]["detail"]
    assert res[1]["fix"] == "check that Ansible reaches w1"


def test_ssh_verdicts_ssh_free_is_one_skip():
    res = ssh_verdicts({}, [], "ssh-free")
    assert len(res) == 1 and res[0]["status"] == "skip" and res[0]["host"] == "*"
    assert "ssh-free" in res[0]["detail"]


def test_ssh_matrix_table():
    nodes = ["coord", "worker1", "worker2"]
    required = ssh_required_pairs(launch_of("pdsh", ["coord"], ["worker1", "worker2"]))
    results = {"coord": {"coord": OK, "worker1": {"rc": 255, "stderr": "x"}, "worker2": OK}}
    lines = ssh_matrix_table(nodes, results, required).splitlines()
    assert lines[0].split() == ["from\\to", "coord", "worker1", "worker2"]
    assert lines[1].split() == ["coord", "ok", "FAIL", "ok"]
    # A rank node logs in nowhere: its row has no pair.
    assert lines[2].split() == ["worker1", "-", "-", "-"] and lines[3].split() == ["worker2", "-", "-", "-"]
    # Columns line up: every cell starts where its header does.
    col = lines[0].index("worker1")
    assert lines[1][col:col + 4] == "FAIL" and lines[1][lines[0].index("worker2"):][:2] == "ok"
    assert lines[2][col] == "-"
    # A login node that gave no answer: every pair it owes is FAIL.
    lines = ssh_matrix_table(nodes, {}, required).splitlines()
    assert lines[1].split() == ["coord", "FAIL", "FAIL", "FAIL"]
