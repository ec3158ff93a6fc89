"""Preflight's settings check, the reuse of a passing preflight, and ``gather`` from the nodes' variables
(module_utils/preflight/evaluate.py; the all-reduce test's result and retest in bandwidth.py, the version
table in versions.py), on a job planned by module_utils/plan/job.py."""
import copy
import datetime
import json

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.bandwidth import bandwidth_test, retest_needed
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.evaluate import DEFAULTS, check_settings, evaluate, gather, reuse_key, reuse_verdict
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.versions import version_table
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.job import plan

NOW = datetime.datetime(2026, 11, 23, 17, 0, 5)
T0 = 1767225600.0
ADDR = {"coord": "10.89.0.2", "worker1": "10.89.0.11", "worker2": "10.89.0.12"}
NODES = ["coord", "worker1", "worker2"]
STACK = {"python": "3.11.2", "torch": "2.13.0+cpu", "cuda": None, "nccl": None, "deepspeed": "0.19.8",
         "transformers": "4.57.1", "trainer": "0.3.0"}
# The role's defaults, as the templated preflight_settings hands them over.
ROLE_SETTINGS = {"max_clock_skew": "2", "min_free_gib_shared": "5", "min_free_gib_local": "5", "link_gbps": "",
                 "bandwidth_fraction": {}, "max_bytes": "", "bandwidth_timeout": "120"}


def worker(addr, slots=1, gpus=0, accel=None, mem=4096):
    return {"slots": slots, "gpus": gpus, "accelerator": accel, "address": addr, "memtotal_mb": mem,
            "interface": "eth0", "env": {"NCCL_SOCKET_IFNAME": "=eth0"}, "answered": True}


def cpu_job(**settings):
    workers = {"worker1": worker(ADDR["worker1"]), "worker2": worker(ADDR["worker2"])}
    job = plan(settings, workers, ["coord"], NOW, backends)
    job["profile"] = "tcp"
    return job


def cuda_job(profile):
    workers = {"worker1": worker(ADDR["worker1"], slots=2, gpus=2),
               "worker2": worker(ADDR["worker2"], slots=2, gpus=2)}
    job = plan({}, workers, ["coord"], NOW, backends)
    job["profile"] = profile
    return job


def raw_result(world_size=2):
    return {"world_size": world_size, "label": "tcp",
            "results": [{"bytes": 4096, "count": 1024, "iters": 50, "seconds": 0.001},
                        {"bytes": 64 << 20, "count": 16 << 20, "iters": 5, "seconds": 0.5}]}


def bw_ok(raw=None, noise="rank 0: warming up\n"):
    line = "ALLREDUCE_RESULT " + json.dumps(raw) if raw is not None else ""
    return {"finished": 1, "rc": 0, "stdout": noise + line, "stderr": ""}


def probe(host, listen=None, connect=None, ssh_targets=()):
    res = {"changed": False, "hostname": host, "user": "deepspeed", "time": T0 + 0.1,
           "controller_before": T0, "controller_after": T0 + 0.2,
           "resolved": dict((n, {"addresses": [ADDR[n]]}) for n in NODES),
           "disk": {"/srv/multinode-deepspeed": {"free_bytes": 50 << 30, "total_bytes": 100 << 30},
                    "/opt/multinode-deepspeed": {"free_bytes": 50 << 30, "total_bytes": 100 << 30}},
           "memlock": {"soft": 8192, "hard": 8192},
           "ssh": dict((t, {"rc": 0, "stdout": "8192", "stderr": "", "seconds": 0.05}) for t in ssh_targets)}
    if listen is not None:
        res["listen"] = listen
    if connect is not None:
        res["connect"] = connect
    return res


def nodevars(job, listen_rc=0, bw=True):
    """What the preflight role leaves in every node's hostvars for ``job`` (coord + worker1 + worker2)."""
    out = {}
    for host in NODES:
        is_rank = host in job["rank_hosts"]
        listen = None
        if host == job["master"]:
            listen = ({"rc": 0, "msg": "", "accepted": 2} if listen_rc == 0 else
                      {"rc": 1, "msg": "port 29500 is not free: Address already in use", "accepted": 0})
        connect = ({"rc": 0, "msg": "", "seconds": 0.01} if listen_rc == 0 else
                   {"rc": 1, "msg": "Connection refused (for 15 s)", "seconds": 15.0}) if is_rank else None
        hv = {
            "ansible_host": ADDR[host],
            "multinode_node": {"versions": dict(STACK), "ipv4": [ADDR[host], "172.17.0.1"],
                               "ipv6": ["fe80::1"] if host == "worker2" else [],
                               "stack_fingerprint": "0123456789abcdef"},
            "multinode_accelerators": {"count": 0, "status": "absent", "names": []},
            "multinode_fabric": {"cluster_address": ADDR[host], "cluster_interface": "eth0"},
            "cluster_hosts_file": True,
            "preflight_probe": probe(host, listen, connect, job["launch"]["ssh_targets"].get(host, [])),
        }
        if is_rank:
            hv["preflight_node_link_gbps"] = None
            hv["preflight_node_tcp_link_gbps"] = 10.0
            if bw:
                hv["preflight_bw"] = {"tcp": bw_ok(raw_result() if host == job["master"] else None)}
        out[host] = hv
    return out


# --------------------------------------------------------------------------- check_settings

def test_check_settings_good_defaults_give_nothing():
    assert check_settings({}) == []
    assert check_settings(dict(ROLE_SETTINGS)) == []
    assert check_settings(dict(DEFAULTS, max_bytes=65536, bandwidth_timeout=10)) == []
    assert check_settings({"link_gbps": "100", "bandwidth_fraction": {"ib": "0.6", "gloo": 1},
                           "max_bytes": "1073741824"}) == []


@pytest.mark.parametrize("key, value, variable", [
    ("max_clock_skew", -1, "preflight_max_clock_skew=-1"),
    ("min_free_gib_shared", "lots", "preflight_min_free_gib_shared=lots"),
    ("min_free_gib_local", "-0.5", "preflight_min_free_gib_local=-0.5"),
    ("link_gbps", 0, "preflight_link_gbps=0"),
    ("link_gbps", "fast", "preflight_link_gbps=fast"),
    ("bandwidth_fraction", {"eth": 0.5}, "preflight_bandwidth_fraction: eth=0.5"),
    ("bandwidth_fraction", {"tcp": 1.5}, "preflight_bandwidth_fraction: tcp=1.5"),
    ("bandwidth_fraction", {"ib": 0}, "preflight_bandwidth_fraction: ib=0"),
    ("bandwidth_fraction", "0.5", "preflight_bandwidth_fraction=0.5 must be a mapping"),
    ("bandwidth_fraction", [0.5], "preflight_bandwidth_fraction=[0.5] must be a mapping"),
    ("max_bytes", 100, "preflight_max_bytes=100"),
    ("max_bytes", "1G", "preflight_max_bytes=1G"),
    ("bandwidth_timeout", 5, "preflight_bandwidth_timeout=5"),
    ("bandwidth_timeout", "2m", "preflight_bandwidth_timeout=2m"),
])
def test_check_settings_each_bad_value_is_named(key, value, variable):
    settings = dict(ROLE_SETTINGS)
    settings[key] = value
    problems = check_settings(settings)
    assert len(problems) == 1, problems
    assert problems[0].startswith(variable), problems


def test_check_settings_reports_every_problem_at_once():
    problems = check_settings({"max_clock_skew": -3, "link_gbps": 0, "max_bytes": 100,
                               "bandwidth_timeout": 5, "bandwidth_fraction": {"tcp": 1.5, "xyz": 0.1}})
    assert len(problems) == 6
    joined = " ".join(problems)
    for var in ("preflight_max_clock_skew", "preflight_link_gbps", "preflight_max_bytes",
                "preflight_bandwidth_timeout", "tcp=1.5", "xyz=0.1"):
        assert var in joined


# --------------------------------------------------------------------------- reuse_key

def test_reuse_key_is_stable_for_the_same_inputs():
    job = cpu_job()
    hv = nodevars(job)
    key = reuse_key(job, hv, ROLE_SETTINGS)
    assert len(key) == 24 and int(key, 16) >= 0
    assert reuse_key(copy.deepcopy(job), copy.deepcopy(hv), dict(ROLE_SETTINGS)) == key


@pytest.mark.parametrize("change", [
    lambda job, hv, s: hv["worker2"]["multinode_node"].update(stack_fingerprint="fedcba9876543210"),
    lambda job, hv, s: hv["coord"]["multinode_node"].update(stack_fingerprint=None),
    lambda job, hv, s: hv["worker1"].update(ansible_host="10.89.0.99"),
    lambda job, hv, s: hv["worker2"]["multinode_node"].update(ipv4=["10.89.0.13"]),
    lambda job, hv, s: hv["coord"]["multinode_node"]["ipv4"].append("192.168.1.2"),
    lambda job, hv, s: job.update(master_port=29600),
    lambda job, hv, s: job.update(slots={"worker1": 2, "worker2": 1}),
    lambda job, hv, s: s.update(max_clock_skew="5"),
    lambda job, hv, s: s.update(bandwidth_fraction={"gloo": 0.1}),
    lambda job, hv, s: job["env"].update(NCCL_DEBUG="INFO"),
], ids=["stack", "stack-none", "ansible_host", "ipv4", "ipv4-added", "master_port", "slots", "setting",
        "fraction", "env"])
def test_reuse_key_changes_with_what_was_checked(change):
    job, settings = cpu_job(), dict(ROLE_SETTINGS)
    hv = nodevars(job)
    before = reuse_key(job, hv, settings)
    change(job, hv, settings)
    assert reuse_key(job, hv, settings) != before


def test_reuse_key_changes_with_the_planned_master_port_and_slots():
    base = reuse_key(cpu_job(), nodevars(cpu_job()), ROLE_SETTINGS)
    other_port = cpu_job(master_port=29501)
    assert reuse_key(other_port, nodevars(other_port), ROLE_SETTINGS) != base
    workers = {"worker1": worker(ADDR["worker1"], slots=2), "worker2": worker(ADDR["worker2"])}
    two_slots = plan({}, workers, ["coord"], NOW, backends)
    assert reuse_key(two_slots, nodevars(two_slots), ROLE_SETTINGS) != base


def test_reuse_key_ignores_the_run_id_and_run_dir():
    first = cpu_job(run_id="run-a")
    second = cpu_job(run_id="run-b")
    assert first["env"]["MULTINODE_DS_RUN_ID"] != second["env"]["MULTINODE_DS_RUN_ID"]
    assert first["env"]["MULTINODE_DS_RUN_DIR"] != second["env"]["MULTINODE_DS_RUN_DIR"]
    hv = nodevars(first)
    assert reuse_key(first, hv, ROLE_SETTINGS) == reuse_key(second, hv, ROLE_SETTINGS)
    # Only those two variables of the environment are the run's own.
    edited = copy.deepcopy(first)
    edited["env"].update(MULTINODE_DS_RUN_ID="x", MULTINODE_DS_RUN_DIR="/elsewhere", HF_TOKEN_PATH="/t")
    edited["run_id"], edited["run_dir"] = "x", "/elsewhere"
    assert reuse_key(edited, hv, ROLE_SETTINGS) == reuse_key(first, hv, ROLE_SETTINGS)


def test_reuse_key_empty_settings_equal_no_settings():
    job = cpu_job()
    hv = nodevars(job)
    assert reuse_key(job, hv, {"link_gbps": "", "max_bytes": None}) == reuse_key(job, hv)


# --------------------------------------------------------------------------- reuse_verdict

KEY = "abc123"


def record(**kw):
    rec = {"key": KEY, "status": "pass", "time": T0, "run_id": "preflight-20260101-000000"}
    rec.update(kw)
    return rec


@pytest.mark.parametrize("rec, now, why", [
    (None, T0, "no passing preflight recorded"),
    ({}, T0, "no passing preflight recorded"),
    (record(key="other"), T0 + 10, "another job layout"),
    (record(status="fail"), T0 + 10, "another job layout"),
    (record(), T0 + 3601, "3601 s old (preflight_max_age=3600)"),
    (record(), T0 - 30, "-30 s old"),
])
def test_reuse_verdict_refuses(rec, now, why):
    reuse, reason = reuse_verdict(rec, KEY, now, 3600)
    assert reuse is False and why in reason


def test_reuse_verdict_fresh_pass_is_reused_naming_the_run():
    reuse, reason = reuse_verdict(record(), KEY, T0 + 120, "3600")
    assert reuse is True
    assert "120 s ago" in reason and "preflight-20260101-000000" in reason
    # Exactly at the age limit still counts.
    assert reuse_verdict(record(), KEY, T0 + 3600, 3600)[0] is True


# --------------------------------------------------------------------------- version_table

def test_version_table():
    versions = {"coord": dict(STACK), "w1": dict(STACK, torch="2.13.0+cu126", cuda="12.6"),
                "w2": {"error": "no venv"}}
    gpus = {"w1": {"count": 2, "names": ["H100", "H100"]}, "coord": {"count": 0}}
    lines = version_table(["coord", "w1", "w2"], versions, gpus, ["w1", "w2"]).splitlines()
    assert lines[0].split() == ["host", "role", "gpus", "python", "torch", "cuda", "nccl", "deepspeed",
                                "transformers", "trainer"]
    assert lines[1].split()[:4] == ["coord", "coord", "-", "3.11.2"]
    assert lines[2].split()[:7] == ["w1", "worker", "2", "x", "H100/H100", "3.11.2", "2.13.0+cu126"]
    assert lines[3].split() == ["w2", "worker", "-"] + ["?"] * 7
    assert len(lines) == 4


# --------------------------------------------------------------------------- bandwidth_test

def test_bandwidth_test_names_the_failed_node_with_its_last_stderr_lines():
    stderr = "line1\nline2\nNCCL WARN x\nDistBackendError\nTimeout after 120 s\n"
    results = {"worker1": bw_ok(raw_result()),
               "worker2": {"rc": 1, "stdout": "", "stderr": stderr},
               "worker3": {"failed": True, "msg": "async task did not complete within the requested time"}}
    test = bandwidth_test("ib", results, "worker1")
    assert test["ok"] is False and test["label"] == "ib"
    assert "worker2: NCCL WARN x | DistBackendError | Timeout after 120 s" in test["error"]
    assert "line2" not in test["error"]
    # No rc at all (the async job timed out) is a failure too, with its msg.
    assert "worker3: async task did not complete" in test["error"]
    assert "worker1" not in test["error"]
    assert test["raw"] == raw_result()


def test_bandwidth_test_exit_code_without_stderr():
    test = bandwidth_test("tcp", {"w1": {"rc": 137, "stdout": "", "stderr": ""}}, "w1")
    assert test["ok"] is False and test["error"] == "w1: exit 137" and test["raw"] is None


def test_bandwidth_test_reads_the_masters_last_result_line():
    first, last = raw_result(), dict(raw_result(), label="second")
    stdout = "ALLREDUCE_RESULT " + json.dumps(first) + "\nnoise\nALLREDUCE_RESULT " + json.dumps(last) + "\ntrailer"
    results = {"w1": {"rc": 0, "stdout": stdout, "stderr": ""},
               "w2": {"rc": 0, "stdout": "ALLREDUCE_RESULT " + json.dumps({"world_size": 99}), "stderr": ""}}
    test = bandwidth_test("tcp", results, "w1")
    assert test == {"label": "tcp", "ok": True, "error": "", "raw": last}
    # The other node's line is not the result: only the master's counts.
    assert bandwidth_test("tcp", results, "w2")["raw"] == {"world_size": 99}


def test_bandwidth_test_bad_json_gives_no_raw():
    results = {"w1": {"rc": 0, "stdout": "ALLREDUCE_RESULT {\"world_size\": 2, broken", "stderr": ""}}
    test = bandwidth_test("tcp", results, "w1")
    assert test["ok"] is True and test["raw"] is None
    assert bandwidth_test("tcp", {"w1": {"rc": 0, "stdout": "no result"}}, "w1")["raw"] is None


# --------------------------------------------------------------------------- gather, then evaluate

def test_gather_from_the_nodes_variables():
    job = cpu_job()
    assert job["master"] == "worker1" and job["rank_hosts"] == ["worker1", "worker2"]
    data = gather(job, nodevars(job), ["worker1", "worker2"])
    assert data["port"] == {"listener": {"rc": 0, "msg": ""},
                            "probes": {"worker1": {"rc": 0, "msg": "", "seconds": 0.01},
                                       "worker2": {"rc": 0, "msg": "", "seconds": 0.01}}}
    primary = data["bandwidth"]["primary"]
    assert primary == {"label": "tcp", "ok": True, "error": "", "raw": raw_result()}
    assert data["bandwidth"]["fallback"] is None
    assert data["versions"] == dict((h, STACK) for h in NODES)
    assert data["own_addresses"] == {"coord": ["10.89.0.2", "172.17.0.1"],
                                     "worker1": ["10.89.0.11", "172.17.0.1"],
                                     "worker2": ["10.89.0.12", "172.17.0.1", "fe80::1"]}
    assert data["expected_addresses"] == ADDR
    assert data["job"]["rank_hosts"] == {"worker1": 1, "worker2": 1}
    assert data["job"]["local_dir"] == job["home"]
    assert data["tcp_link_gbps"] == {"worker1": 10.0, "worker2": 10.0}
    table = data["version_table"].splitlines()
    assert [line.split()[:2] for line in table[1:]] == [["coord", "coord"], ["worker1", "worker"],
                                                        ["worker2", "worker"]]


def test_gather_then_evaluate_passes_the_master_port():
    job = cpu_job()
    report = evaluate(gather(job, nodevars(job), ["worker1", "worker2"]), ROLE_SETTINGS)
    port = [(v["host"], v["status"]) for v in report["verdicts"] if v["check"] == "master_port"]
    assert port == [("worker1", "pass"), ("worker1", "pass"), ("worker2", "pass")]
    bw = [v for v in report["verdicts"] if v["check"] == "bandwidth"]
    assert len(bw) == 1 and bw[0]["status"] == "pass"
    assert report["bandwidth"]["link_gbps"] == 10.0
    assert report["status"] == "pass", report["findings"]


def test_gather_with_the_master_port_taken():
    job = cpu_job()
    data = gather(job, nodevars(job, listen_rc=1, bw=False), ["worker1", "worker2"])
    assert data["port"]["listener"] == {"rc": 1, "msg": "port 29500 is not free: Address already in use"}
    assert data["bandwidth"] == {"primary": None, "fallback": None}
    report = evaluate(data, ROLE_SETTINGS)
    port = [v for v in report["verdicts"] if v["check"] == "master_port"]
    assert [(v["host"], v["status"]) for v in port] == [("worker1", "fail")]
    assert "not free" in port[0]["detail"] and "master_port" in port[0]["fix"]
    bw = [v for v in report["verdicts"] if v["check"] == "bandwidth"]
    assert [v["status"] for v in bw] == ["skip"]
    assert report["status"] == "fail"


def test_gather_a_silent_node_and_a_missing_listener():
    job = cpu_job()
    hv = nodevars(job)
    del hv["worker1"]["preflight_probe"]["listen"]
    del hv["worker2"]
    data = gather(job, hv)
    assert "port" not in data
    assert data["versions"]["worker2"] == {"error": "the node did not answer"}
    assert "worker2" not in data["probes"]
    # Only the nodes that left a result are read: the master's result stands.
    assert data["bandwidth"]["primary"]["ok"] is True
    report = evaluate(data)
    assert ("probe", "worker2") in [(v["check"], v["host"]) for v in report["verdicts"] if v["status"] == "fail"]


# --------------------------------------------------------------------------- retest_needed

def failed_ib(job):
    hv = nodevars(job)
    for host in job["rank_hosts"]:
        hv[host]["preflight_bw"] = {"ib": {"rc": 0, "stdout": "", "stderr": ""}}
    hv["worker2"]["preflight_bw"]["ib"] = {"rc": 1, "stdout": "", "stderr": "NCCL WARN Call to ibv_modify_qp failed"}
    return hv


def test_retest_needed_cpu_never():
    job = cpu_job()
    hv = nodevars(job)
    for host in job["rank_hosts"]:
        hv[host]["preflight_bw"] = {"tcp": {"rc": 1, "stderr": "boom"}}
    job["profile"] = "ib"     # the nodes' RDMA does not matter to gloo
    assert retest_needed(job, hv) is False


def test_retest_needed_cuda_ib_failed():
    job = cuda_job("ib")
    assert job["accelerator"] == "cuda"
    assert retest_needed(job, failed_ib(job)) is True


def test_retest_needed_cuda_ib_passing_and_missing_results():
    job = cuda_job("ib")
    hv = nodevars(job)
    raw = raw_result(world_size=4)
    hv["worker1"]["preflight_bw"] = {"ib": bw_ok(raw)}
    hv["worker2"]["preflight_bw"] = {"ib": bw_ok()}
    # 64 MiB in 0.5 s on 4 ranks: 0.2 GB/s bus bandwidth; 1 Gb/s x 0.5 = 0.0625 GB/s: passes.
    assert retest_needed(job, hv, link_gbps="1") is False
    # Against a 400 Gb/s link (0.5 -> 25 GB/s) it crawls: test tcp.
    assert retest_needed(job, hv, link_gbps=400) is True
    # A node without a result (the test did not run there): no retest.
    del hv["worker2"]["preflight_bw"]
    assert retest_needed(job, hv, link_gbps=400) is False


def test_retest_needed_cuda_tcp_never():
    job = cuda_job("tcp")
    hv = failed_ib(job)
    for host in job["rank_hosts"]:
        hv[host]["preflight_bw"] = {"tcp": {"rc": 1, "stderr": "boom"}}
    assert retest_needed(job, hv) is False


def test_bandwidth_off_is_a_skip_not_a_failure():
    job = cpu_job()
    data = gather(job, nodevars(job, bw=False), ["worker1", "worker2"])
    without = evaluate(data, ROLE_SETTINGS)
    assert [v["status"] for v in without["verdicts"] if v["check"] == "bandwidth"] == ["fail"]
    report = evaluate(data, dict(ROLE_SETTINGS, bandwidth="false"))
    bw = [v for v in report["verdicts"] if v["check"] == "bandwidth"]
    assert [v["status"] for v in bw] == ["skip"] and "preflight_bandwidth=false" in bw[0]["detail"]
    assert report["status"] == "pass", report["findings"]
