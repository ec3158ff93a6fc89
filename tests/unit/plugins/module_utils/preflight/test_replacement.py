"""The quick preflight of a node that takes a failed node's place (plugins/module_utils/preflight/replacement.py)."""
import json
from pathlib import Path

from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.replacement import replacement_verdicts

T0 = 1795632300.0
JOB = {"backend": "pdsh", "shared_dir": "/shared", "home": "/opt/multinode-deepspeed",
       "addresses": {"worker1": "10.89.0.11", "worker3": "10.89.0.13"},
       "launch": {"ssh_pairs": [["coord", "coord"], ["coord", "worker1"], ["coord", "worker3"]]}}


def probe(skew=0.0, free_gib=40, resolves=None):
    """What node_probe returns on a node (its RETURN), with the action plugin's controller clock bracket."""
    free = int(free_gib * (1 << 30))
    return {"time": T0 + 0.1 + skew, "controller_before": T0, "controller_after": T0 + 0.2, "elapsed": 0.01,
            "hostname": "worker3", "user": "deepspeed",
            "resolved": resolves or {"worker1": {"addresses": ["10.89.0.11"]}, "worker3": {"addresses": ["10.89.0.13"]}},
            "disk": {"/shared": {"free_bytes": free, "total_bytes": 2 * free},
                     "/opt/multinode-deepspeed": {"free_bytes": free, "total_bytes": 2 * free}},
            "memlock": {"soft": 8192, "hard": 8192}, "ssh": {}}


SSH_OK = {"coord": {"worker3": {"rc": 0, "stdout": "8192", "stderr": ""}}}


def by_check(verdicts):
    return dict(((v["check"], v["host"]), v["status"]) for v in verdicts)


def test_a_spare_that_fits_passes_every_quick_check():
    verdicts = replacement_verdicts(JOB, ["worker3"], {"worker3": probe()}, SSH_OK, reference={"coord": probe()})
    assert by_check(verdicts) == {("names", "worker3"): "pass", ("clock", "worker3"): "pass",
                                  ("disk", "worker3"): "pass", ("ssh", "coord"): "pass"}
    # Only the SSH login to the new node is tried again; ssh-free needs none.
    assert replacement_verdicts(dict(JOB, backend="ssh-free", launch={"ssh_pairs": []}), ["worker3"],
                                {"worker3": probe()}, {})[-1]["check"] == "disk"


def test_each_failing_check_names_the_node_and_its_fix():
    wrong = {"worker1": {"addresses": ["10.89.0.99"]}, "worker3": {"addresses": ["10.89.0.13"]}}
    verdicts = replacement_verdicts(JOB, ["worker3"], {"worker3": probe(skew=30, free_gib=1, resolves=wrong)},
                                    {"coord": {"worker3": {"rc": 255, "stderr": "Host key verification failed."}}},
                                    {"max_clock_skew": 2, "min_free_gib_shared": None}, reference={"coord": probe()})
    failed = dict(((v["check"], v["host"]), v) for v in verdicts if v["status"] == "fail")
    assert "worker1 resolves to 10.89.0.99, not 10.89.0.11" in failed[("names", "worker3")]["detail"]
    assert "over the bound of 2 s" in failed[("clock", "worker3")]["detail"]
    assert "needs 5 GiB" in failed[("disk", "worker3")]["detail"]
    assert "Host key verification failed" in failed[("ssh", "coord")]["detail"] and failed[("ssh", "coord")]["fix"]


def test_a_spare_the_probe_did_not_reach_fails():
    verdicts = replacement_verdicts(JOB, ["worker3"], {"worker3": {"unreachable": True, "msg": "timed out"}}, {})
    assert verdicts[0] == {"check": "probe", "host": "worker3", "status": "fail",
                           "detail": "the node probe did not run: timed out",
                           "fix": "check that worker3 is up and reachable over SSH"}
    assert ("ssh", "coord") in by_check(verdicts)    # not tested: failed too


def test_the_bandwidth_test_across_the_new_nodes_is_judged_as_preflight_judges_it():
    from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.replacement import bandwidth_check
    job = dict(JOB, master="worker1", rank_hosts=["worker1", "worker3"], accelerator="cpu")
    # The test's own output between two podman nodes (gloo), as rank 0 prints it last.
    raw = (Path(__file__).resolve().parents[4] / "fixtures" / "preflight" / "gloo-2node-podman.json").read_text()
    done = {"worker1": {"rc": 0, "stdout": "ALLREDUCE_RESULT " + json.dumps(json.loads(raw))},
            "worker3": {"rc": 0, "stdout": ""}}
    v = bandwidth_check(job, done)
    assert v["check"] == "bandwidth" and v["host"] == "worker1,worker3"
    assert v["status"] == "warn" and "the link speed is unknown" in v["detail"], v   # no threshold without it
    assert bandwidth_check(job, done, link_gbps=1)["status"] == "pass"
    failed = bandwidth_check(job, dict(done, worker3={"rc": 1, "stderr": "gloo: connection refused"}))
    assert failed["status"] == "fail" and "worker3: gloo: connection refused" in failed["detail"]
