"""``evaluate`` (module_utils/preflight/evaluate.py) end to end on the data playbooks/preflight.yml gathers,
and its parts: the settings, the job's layout, the nodes' checks, the bandwidth judgement and the tables."""
import copy

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.bandwidth import (
    DEFAULT_FRACTIONS, bandwidth_rows, format_bandwidth_table, large_message_busbw)
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.evaluate import (
    DEFAULTS, bandwidth_judgement, effective_settings, evaluate, job_layout, node_verdicts, probe_verdicts,
    report_tables)
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.ssh import ssh_matrix_table, ssh_required_pairs
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.verdicts import PreflightError, format_verdicts, verdict

from tests.unit.plugins.module_utils.preflight.preflight_data import (
    CPU_COORD, GIB, LISTENER_OK, LISTENER_TAKEN, PROBES_OK, STACK, launch_of, load, passing_test)


T0 = 1767225600.0


NODES = ["coord", "worker1", "worker2"]


ADDR = {"coord": "10.89.0.2", "worker1": "10.89.0.3", "worker2": "10.89.0.4"}


SHARED, LOCAL = "/srv/multinode-deepspeed", "/opt/multinode-deepspeed"


def ssh_ok(memlock="8192"):
    return {"rc": 0, "stdout": memlock, "stderr": "", "seconds": 0.08}


def node_probe_result(host, skew=0.0):
    """A node_probe register as the action plugin returns it."""
    return {"changed": False, "hostname": host, "user": "deepspeed",
            "controller_before": T0, "controller_after": T0 + 0.3, "time": T0 + 0.15 + skew,
            "resolved": dict((n, {"addresses": [ADDR[n]]}) for n in NODES),
            "disk": {SHARED: {"free_bytes": 50 * GIB, "total_bytes": 200 * GIB},
                     LOCAL: {"free_bytes": 40 * GIB, "total_bytes": 100 * GIB}},
            "memlock": {"soft": 8192, "hard": 8192}, "ssh": {}}


def ssh_register(targets, memlock="8192"):
    return {"changed": False, "hostname": "x", "user": "deepspeed", "resolved": {}, "disk": {},
            "memlock": {"soft": 8192, "hard": 8192}, "time": T0, "controller_before": T0, "controller_after": T0,
            "ssh": dict((t, ssh_ok(memlock)) for t in targets)}


def job_data():
    """What playbooks/preflight.yml gathers for coord + worker1 + worker2 (pdsh, cpu, tcp)."""
    versions = {"coord": dict(CPU_COORD), "worker1": dict(CPU_COORD), "worker2": dict(CPU_COORD)}
    return {
        "job": {"run_id": "preflight-20260101-000000", "backend": "pdsh", "accelerator": "cpu", "profile": "tcp",
                "coordinators": ["coord"], "rank_hosts": {"worker1": 1, "worker2": 1},
                "first_ranks": {"worker1": 0, "worker2": 1}, "world_size": 2, "master": "worker1",
                "master_addr": "10.89.0.3", "master_port": 29500,
                "run_dir": SHARED + "/runs/preflight-20260101-000000", "shared_dir": SHARED, "local_dir": LOCAL,
                "venv": LOCAL + "/venv", "launch": launch_of("pdsh", ["coord"], ["worker1", "worker2"])},
        "versions": versions,
        "probes": dict((h, node_probe_result(h)) for h in NODES),
        "ssh": {"coord": ssh_register(NODES), "worker1": ssh_register(["worker1"]),
                "worker2": ssh_register(["worker2"])},
        "port": {"listener": copy.deepcopy(LISTENER_OK), "probes": copy.deepcopy(PROBES_OK)},
        "gpus": {"worker1": 0, "worker2": 0, "worker1:status": "no nvidia-smi", "worker2:status": "no nvidia-smi"},
        "expected_addresses": dict(ADDR),
        "own_addresses": dict((h, [a]) for h, a in ADDR.items()),
        "link_gbps": {"worker1": None, "worker2": None},        # podman's veth reports no speed
        "tcp_link_gbps": {"worker1": None, "worker2": None},
        "bandwidth": {"primary": {"label": "tcp", "ok": True, "error": "", "raw": load("gloo-2node-podman.json")},
                      "fallback": None},
    }


def failures(report):
    return [(v["check"], v["host"]) for v in report["verdicts"] if v["status"] == "fail"]


def test_evaluate_names_fix_follows_each_nodes_cluster_hosts_file():
    data = job_data()
    for node in ("coord", "worker1"):
        data["probes"][node]["resolved"]["worker2"] = {"error": "Name or service not known"}
    data["hosts_file"] = {"coord": "false", "worker1": True, "worker2": "no"}
    fixes = dict((v["host"], v["fix"]) for v in evaluate(data)["verdicts"]
                 if v["check"] == "names" and v["status"] == "fail")
    assert set(fixes) == {"coord", "worker1"}
    assert fixes["coord"].startswith("cluster_hosts_file is false for coord")
    assert fixes["worker1"].startswith("run site.yml: with cluster_hosts_file: true")


def test_evaluate_healthy_cpu_job_passes():
    report = evaluate(job_data())
    assert report["status"] == "pass" and report["findings"] == [] and failures(report) == []
    statuses = dict(((v["check"], v["host"]), v["status"]) for v in report["verdicts"])
    for check in ("versions", "names", "clock", "disk"):
        for h in NODES:
            assert statuses[(check, h)] == "pass", (check, h)
    assert statuses[("memlock", "worker1")] == "skip"            # tcp pins no memory
    assert statuses[("accelerators", "worker2")] == "pass"
    assert statuses[("master_port", "worker2")] == "pass"
    # pdsh: the coordinator to every node of the job, itself included; a rank node logs in nowhere.
    assert sum(1 for v in report["verdicts"] if v["check"] == "ssh" and v["status"] == "pass") == 3
    # podman's links have no speed: the bandwidth is measured but not judged.
    assert statuses[("bandwidth", "worker1,worker2")] == "warn"
    assert len(report["warnings"]) == 1 and report["warnings"][0].startswith("bandwidth on worker1,worker2:")
    bw = report["bandwidth"]
    assert bw["primary"]["key"] == "gloo" and bw["fallback"] is None and report["advice"] is None
    assert bw["primary"]["busbw_gbps"] == large_message_busbw(
        bandwidth_rows(load("gloo-2node-podman.json")))
    tables = report["tables"]
    assert set(tables) == {"ssh", "verdicts", "bandwidth"}
    assert tables["ssh"].splitlines()[1].split() == ["coord", "ok", "ok", "ok"]
    assert tables["bandwidth"].splitlines()[0] == "all_reduce tcp (gloo, 2 ranks on 2 nodes): WARN"
    assert tables["bandwidth"].splitlines()[-1].split()[0] == "64M"
    assert len(tables["verdicts"].splitlines()) == len(report["verdicts"]) + 1
    assert report["settings"]["max_clock_skew"] == 2.0


def test_evaluate_with_a_known_link_judges_the_bandwidth():
    data = job_data()
    # CPU ranks (gloo) are judged on the tcp side's link.
    data["tcp_link_gbps"] = {"worker1": 10.0, "worker2": 25.0}
    report = evaluate(data)
    v = [v for v in report["verdicts"] if v["check"] == "bandwidth"][0]
    assert v["status"] == "pass" and report["bandwidth"]["link_gbps"] == 10.0
    assert report["bandwidth"]["primary"]["threshold_gbps"] == 0.0625
    # The link_gbps setting overrides the facts: 200 Gb/s x 5% = 1.25 GB/s is more than gloo reached.
    over = evaluate(data, {"link_gbps": 200.0})
    assert over["status"] == "fail" and failures(over) == [("bandwidth", "worker1,worker2")]
    assert "check the links between worker1, worker2" in over["findings"][0]


def test_evaluate_settings_none_keep_the_defaults():
    report = evaluate(job_data(), {"max_clock_skew": None, "min_free_gib_local": 100})
    assert report["settings"]["max_clock_skew"] == 2.0 and report["settings"]["min_free_gib_local"] == 100
    assert failures(report) == [("disk", "coord"), ("disk", "worker1"), ("disk", "worker2")]


def test_evaluate_sshd_down_on_worker1():
    data = job_data()
    refused = {"rc": 255, "stdout": "", "stderr": "ssh: connect to host worker1 port 22: Connection refused",
               "seconds": 0.01}
    data["ssh"]["coord"]["ssh"]["worker1"] = dict(refused)
    report = evaluate(data)
    assert report["status"] == "fail"
    assert failures(report) == [("ssh", "coord")]
    assert all("-> worker1" in f and "sshd is not running" in f for f in report["findings"])
    assert report["tables"]["ssh"].splitlines()[1].split() == ["coord", "ok", "FAIL", "ok"]


def test_evaluate_deepspeed_differs_on_worker2():
    data = job_data()
    data["versions"]["worker2"]["deepspeed"] = "0.19.7"
    report = evaluate(data)
    assert failures(report) == [("versions", "worker2")]
    assert len(report["findings"]) == 1
    assert "deepspeed 0.19.7 (worker1 has 0.19.8)" in report["findings"][0]
    assert "site.yml" in report["findings"][0]


def test_evaluate_master_port_taken_skips_the_bandwidth():
    data = job_data()
    data["port"]["listener"] = copy.deepcopy(LISTENER_TAKEN)
    data["bandwidth"] = {"primary": None, "fallback": None}     # the playbook does not run it
    report = evaluate(data)
    assert failures(report) == [("master_port", "worker1")]
    bw = [v for v in report["verdicts"] if v["check"] == "bandwidth"]
    assert len(bw) == 1 and bw[0]["status"] == "skip"
    assert bw[0]["detail"] == "not run: the master port is not free"
    assert "bandwidth" not in report["tables"] and report["bandwidth"]["primary"] is None


def test_evaluate_without_bandwidth_result_fails():
    # The port was free, so the test should have run: no result is a failure, never a silent pass.
    data = job_data()
    del data["bandwidth"]
    report = evaluate(data)
    bw = [v for v in report["verdicts"] if v["check"] == "bandwidth"][0]
    assert bw["status"] == "fail" and bw["detail"] == "the all-reduce test gave no result"
    assert report["status"] == "fail"


def test_evaluate_worker1_cannot_resolve_worker2():
    data = job_data()
    data["probes"]["worker1"]["resolved"]["worker2"] = {"error": "Name or service not known"}
    report = evaluate(data)
    assert failures(report) == [("names", "worker1")]
    assert "/etc/hosts on worker1" in report["findings"][0]


def test_evaluate_clock_skew_on_worker2():
    data = job_data()
    data["probes"]["worker2"] = node_probe_result("worker2", skew=30.0)
    report = evaluate(data)
    assert failures(report) == [("clock", "worker2")]
    assert evaluate(data, {"max_clock_skew": 60})["status"] == "pass"


@pytest.mark.parametrize("registered", [
    {"skipped": True, "changed": False, "skip_reason": "Conditional result was False", "false_condition": "x"},
    {"failed": True, "msg": "MODULE FAILURE", "changed": False},
    {"unreachable": True, "msg": "Failed to connect to the host via ssh", "changed": False},
    None,
])
def test_evaluate_unanswered_probe_is_a_probe_failure(registered):
    data = job_data()
    data["probes"]["worker2"] = registered
    report = evaluate(data)
    assert failures(report) == [("probe", "worker2")]
    assert report["findings"] == ["probe on worker2: the node did not answer the probe. "
                                  "Fix: check that Ansible reaches worker2."]
    # Its disks, clock and names are not judged (no made-up failures).
    assert not [v for v in report["verdicts"] if v["host"] == "worker2" and v["check"] in ("disk", "clock", "names")]


def test_evaluate_skipped_ssh_register_is_not_tested():
    data = job_data()
    data["ssh"]["coord"] = {"skipped": True, "changed": False}
    report = evaluate(data)
    assert failures(report) == [("ssh", "coord")] * 3
    assert "coord gave no answer" in report["findings"][0]


def test_evaluate_accepts_ssh_as_host_target_results():
    data = job_data()
    data["ssh"] = dict((h, r["ssh"]) for h, r in data["ssh"].items())
    assert evaluate(data)["status"] == "pass"


def test_evaluate_ssh_free_needs_no_ssh():
    data = job_data()
    data["job"].update(backend="ssh-free", launch=launch_of("ssh-free"))
    data["ssh"] = dict((h, {"skipped": True, "changed": False}) for h in NODES)
    report = evaluate(data)
    assert report["status"] == "pass"
    ssh = [v for v in report["verdicts"] if v["check"] == "ssh"]
    assert len(ssh) == 1 and ssh[0]["status"] == "skip"
    assert report["tables"]["ssh"] == "SSH: not needed by backend ssh-free"


def rdma_data():
    data = job_data()
    gpu = dict(STACK)
    data["job"].update(accelerator="cuda", profile="ib", rank_hosts={"worker1": 8, "worker2": 8})
    data["versions"].update(worker1=dict(gpu), worker2=dict(gpu))
    data["gpus"] = {"worker1": 8, "worker2": 8, "worker1:status": "ok", "worker2:status": "ok"}
    data["ssh"]["coord"] = ssh_register(NODES, memlock="unlimited")
    data["link_gbps"] = {"worker1": 1600.0, "worker2": 1600.0}
    data["tcp_link_gbps"] = {"worker1": 10.0, "worker2": 10.0}
    data["bandwidth"] = {
        "primary": {"label": "ib", "ok": False, "raw": None,
                    "error": "worker1: NCCL WARN Call to ibv_modify_qp failed with error Connection timed out "
                             "| worker1: torch.distributed.DistBackendError: NCCL error"},
        "fallback": dict(passing_test("tcp", 1.1, world_size=16), error=""),
    }
    return data


def test_evaluate_rdma_failure_with_tcp_working_advises_pinning_tcp():
    report = evaluate(rdma_data())
    assert report["status"] == "fail"
    assert failures(report) == [("bandwidth", "worker1,worker2")]
    advice = report["advice"]
    assert advice["variable"] == "nccl_profile" and advice["value"] == "tcp"
    assert "nccl_profile: tcp" in advice["message"] and "worker1, worker2" in advice["message"]
    bw = [v for v in report["verdicts"] if v["check"] == "bandwidth"][0]
    assert bw["fix"] == advice["message"]
    assert "Call to ibv_modify_qp failed" in bw["detail"]
    want = "bandwidth on worker1,worker2: %s. Fix: %s." % (bw["detail"].rstrip("."), advice["message"].rstrip("."))
    assert report["findings"] == [want]
    fallback = report["bandwidth"]["fallback"]
    assert fallback["status"] == "pass" and fallback["link_gbps"] == 10.0 and fallback["key"] == "tcp"
    assert report["bandwidth"]["link_gbps"] == 1600.0
    # RDMA memlock came over the coordinator's SSH login: unlimited.
    assert [v["status"] for v in report["verdicts"] if v["check"] == "memlock"] == ["pass", "pass"]
    assert report["tables"]["bandwidth"].splitlines()[0] == "all_reduce ib (nccl, 0 ranks on 2 nodes): FAIL"
    assert report["tables"]["bandwidth_tcp"].splitlines()[0] == "all_reduce tcp (fallback test): PASS"


def test_evaluate_rdma_and_tcp_both_failing_gives_no_variable():
    data = rdma_data()
    data["bandwidth"]["fallback"] = {"label": "tcp", "ok": False, "error": "worker2: exit 1", "raw": None}
    report = evaluate(data)
    assert report["advice"]["variable"] is None and "broken" in report["advice"]["message"]
    assert [v["fix"] for v in report["verdicts"] if v["check"] == "bandwidth"] == [report["advice"]["message"]]


def test_evaluate_rdma_gpu_count_and_memlock_failures():
    data = rdma_data()
    data["gpus"]["worker2"] = 4
    data["ssh"]["coord"]["ssh"]["worker1"]["stdout"] = "8192"
    report = evaluate(data)
    assert set(failures(report)) == {("bandwidth", "worker1,worker2"), ("accelerators", "worker2"),
                                     ("memlock", "worker1")}


def test_evaluate_does_not_modify_its_input():
    data = job_data()
    before = copy.deepcopy(data)
    evaluate(data, {"bandwidth_fraction": {"gloo": 0.5}})
    assert data == before
    assert DEFAULT_FRACTIONS["gloo"] == 0.05


@pytest.mark.parametrize("mutate, error", [
    (lambda d: d.pop("job"), KeyError),
    (lambda d: d["job"].pop("rank_hosts"), KeyError),
    (lambda d: d["probes"]["worker1"].update(controller_after=T0 - 1), PreflightError),
])
def test_evaluate_malformed_data_raises(mutate, error):
    data = job_data()
    mutate(data)
    with pytest.raises(error):
        evaluate(data)


def test_the_tcp_retest_is_judged_on_the_ethernet_speed_not_the_rdma_override():
    primary = {"label": "ib", "ok": False, "error": "NCCL WARN Call to ibv_modify_qp failed", "raw": None}
    tcp = passing_test("tcp", 1.0)
    data = {"job": {"backend": "ssh-free", "launch": launch_of("ssh-free"), "accelerator": "cuda", "profile": "ib",
                    "coordinators": [],
                    "rank_hosts": {"w1": 1, "w2": 1}, "master": "w1", "master_port": 29500,
                    "shared_dir": "/s", "local_dir": "/l"},
            "tcp_link_gbps": {"w1": 10.0, "w2": 10.0}, "gpus": {"w1": 1, "w2": 1},
            "bandwidth": {"primary": primary, "fallback": tcp}}
    report = evaluate(data, {"link_gbps": "400"})     # a string, as -e gives it
    assert report["bandwidth"]["link_gbps"] == 400.0
    assert report["bandwidth"]["fallback"]["link_gbps"] == 10.0
    assert report["bandwidth"]["fallback"]["status"] == "pass"


def test_settings_given_as_strings_are_numbers():
    data = job_data()
    data["tcp_link_gbps"] = {"worker1": 10.0, "worker2": 10.0}
    report = evaluate(data, {"max_clock_skew": "3", "bandwidth_fraction": {"gloo": "0.9"}})
    assert report["settings"]["max_clock_skew"] == 3.0
    assert report["bandwidth"]["primary"]["fraction"] == 0.9 and report["bandwidth"]["primary"]["status"] == "fail"


def test_cpu_ranks_on_rdma_nodes_are_judged_as_tcp():
    data = job_data()
    data["job"]["profile"] = "ib"
    data["link_gbps"] = {"worker1": 800.0, "worker2": 800.0}
    data["tcp_link_gbps"] = {"worker1": 10.0, "worker2": 10.0}
    report = evaluate(data)
    assert report["bandwidth"]["link_gbps"] == 10.0
    assert all(v["status"] == "skip" for v in report["verdicts"] if v["check"] == "memlock")


def test_no_fabric_advice_when_other_checks_fail():
    primary = {"label": "ib", "ok": False, "error": "NCCL WARN Call to ibv_modify_qp failed", "raw": None}
    data = {"job": {"backend": "ssh-free", "launch": launch_of("ssh-free"), "accelerator": "cuda", "profile": "ib",
                    "coordinators": [],
                    "rank_hosts": {"w1": 1, "w2": 1}, "master": "w1", "master_port": 29500,
                    "shared_dir": "/s", "local_dir": "/l"},
            "tcp_link_gbps": {"w1": 10.0, "w2": 10.0}, "gpus": {"w1": 1, "w2": 1},
            "bandwidth": {"primary": primary, "fallback": passing_test("tcp", 1.0)}}
    report = evaluate(data)       # no probes: the probe checks fail
    assert report["advice"] is None


# --------------------------------------------------------------------------- the parts of evaluate

def test_effective_settings_fill_in_the_defaults_as_numbers():
    cfg, fractions = effective_settings({"max_clock_skew": "3", "min_free_gib_local": None, "link_gbps": "",
                                         "min_memlock_kib": "64", "bandwidth_fraction": {"ib": "0.7"}})
    assert cfg["max_clock_skew"] == 3.0 and cfg["min_free_gib_local"] == 5.0 and cfg["link_gbps"] is None
    assert cfg["min_memlock_kib"] == 64.0 and cfg["min_free_gib_shared"] == 5.0
    assert fractions == {"ib": 0.7, "roce": 0.4, "tcp": 0.3, "gloo": 0.05}
    assert effective_settings(None) == (DEFAULTS, DEFAULT_FRACTIONS)
    assert DEFAULT_FRACTIONS["ib"] == 0.5
    with pytest.raises(ValueError):
        effective_settings({"link_gbps": "fast"})


def test_job_layout_judges_cpu_ranks_as_tcp_over_gloo():
    data = job_data()
    data["job"]["profile"] = "ib"
    layout = job_layout(data)
    assert [layout[k] for k in ("backend", "accelerator", "profile", "collective")] == ["pdsh", "cpu", "tcp", "gloo"]
    assert layout["nodes"] == NODES and layout["ranks"] == ["worker1", "worker2"] and layout["coordinators"] == ["coord"]
    assert layout["slots"] == {"worker1": 1, "worker2": 1} and layout["job"] is data["job"]
    data["job"]["accelerator"] = "cuda"
    assert [job_layout(data)[k] for k in ("profile", "collective")] == ["ib", "nccl"]
    data["job"]["profile"] = None
    assert job_layout(data)["profile"] == "tcp"
    data["job"]["coordinators"] = ["worker1"]
    assert job_layout(data)["nodes"] == ["worker1", "worker2"]


def test_job_layout_keeps_the_results_that_answered():
    data = job_data()
    data["probes"]["worker2"] = {"skipped": True, "changed": False}
    data["ssh"]["worker1"] = {"failed": True, "msg": "MODULE FAILURE"}
    data["ssh"]["worker2"] = {"worker2": ssh_ok()}          # host -> target -> result
    layout = job_layout(data)
    assert sorted(layout["probes"]) == ["coord", "worker1"] and sorted(layout["ssh"]) == ["coord", "worker2"]
    assert sorted(layout["ssh"]["coord"]) == NODES and layout["ssh"]["worker2"] == {"worker2": ssh_ok()}


def test_node_verdicts_and_probe_verdicts_split_the_nodes_by_their_probe():
    data = job_data()
    data["probes"]["worker2"] = None
    layout = job_layout(data)
    out = node_verdicts(data, layout, effective_settings(None)[0])
    assert [(v["check"], v["host"]) for v in out] == [
        ("names", "coord"), ("names", "worker1"), ("clock", "coord"), ("clock", "worker1"), ("disk", "coord"),
        ("disk", "coord"), ("disk", "worker1"), ("disk", "worker1"), ("memlock", "worker1"), ("memlock", "worker2"),
        ("accelerators", "worker1"), ("accelerators", "worker2")]
    assert probe_verdicts(layout) == [verdict(
        "probe", "worker2", "fail", "the node did not answer the probe", "check that Ansible reaches worker2")]
    assert probe_verdicts(job_layout(job_data())) == []


def test_bandwidth_judgement_links_of_the_test_and_the_retest():
    data = rdma_data()
    layout = job_layout(data)
    link, primary, fallback = bandwidth_judgement(data, layout, *effective_settings(None))
    assert link == 1600.0 and primary["link_gbps"] == 1600.0 and primary["status"] == "fail"
    assert fallback["link_gbps"] == 10.0 and fallback["key"] == "tcp" and fallback["status"] == "pass"
    # preflight_link_gbps overrides the job's link, never the retest's.
    cfg, fractions = effective_settings({"link_gbps": "400"})
    link, primary, fallback = bandwidth_judgement(data, layout, cfg, fractions)
    assert link == 400.0 and primary["link_gbps"] == 400.0 and fallback["link_gbps"] == 10.0
    data["bandwidth"] = {}
    assert bandwidth_judgement(data, layout, cfg, fractions) == (400.0, None, None)


def test_bandwidth_judgement_of_cpu_ranks_takes_the_tcp_side_speed():
    data = job_data()
    data["link_gbps"] = {"worker1": 800.0, "worker2": 800.0}
    cfg, fractions = effective_settings(None)
    layout = job_layout(data)
    assert bandwidth_judgement(data, layout, cfg, fractions)[0] is None      # the tcp side: no speed
    del data["tcp_link_gbps"]
    assert bandwidth_judgement(data, layout, cfg, fractions)[0] == 800.0     # no tcp side given
    data["tcp_link_gbps"] = {"worker1": 10.0, "worker2": 25.0}
    link, primary, fallback = bandwidth_judgement(data, layout, cfg, fractions)
    assert link == 10.0 and primary["key"] == "gloo" and primary["link_gbps"] == 10.0 and fallback is None


def test_report_tables():
    data = rdma_data()
    data["bandwidth"]["primary"] = passing_test("ib", 30.0, world_size=16)
    layout = job_layout(data)
    required = ssh_required_pairs(launch_of("pdsh", ["coord"], ["worker1", "worker2"]))
    link, primary, fallback = bandwidth_judgement(data, layout, *effective_settings(None))
    vs = [verdict("bandwidth", "worker1,worker2", primary["status"], primary["reason"])]
    tables = report_tables(data, layout, required, vs, primary, fallback)
    assert link == 1600.0 and sorted(tables) == ["bandwidth", "bandwidth_tcp", "ssh", "verdicts"]
    assert tables["ssh"] == ssh_matrix_table(NODES, layout["ssh"], required)
    assert tables["verdicts"] == format_verdicts(vs)
    assert tables["bandwidth"] == format_bandwidth_table(
        primary["rows"], "all_reduce ib (nccl, 16 ranks on 2 nodes): FAIL")
    assert tables["bandwidth_tcp"].splitlines()[0] == "all_reduce tcp (fallback test): PASS"
    # No SSH needed and no test judged: a line for SSH, no bandwidth table.
    data["job"].update(backend="ssh-free", launch=launch_of("ssh-free"))
    assert report_tables(data, job_layout(data), [], vs, None, None) == {
        "ssh": "SSH: not needed by backend ssh-free", "verdicts": format_verdicts(vs)}
