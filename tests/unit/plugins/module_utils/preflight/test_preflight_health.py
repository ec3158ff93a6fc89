"""Node health in preflight (issue 47, point 3): module_utils/preflight/health.py judges each rank node's figures
(multinode_ds.health, measured on the local cluster: worker2 limited to a third of a core with a 3 ms CPU period) against
the other nodes' median and the node's own past."""
import json

from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight import health

# Measured on the local cluster with `python -m multinode_ds.health --shared /shared/runs` on both workers at once;
# then with worker2 under `podman update --cpu-period 3000 --cpu-quota 1000` while three busy loops ran on the host.
HEALTHY = {"worker1": {"compute_gflops": 156.213, "memory_gbps": 42.593, "shared_write_mbps": 1286.245},
           "worker2": {"compute_gflops": 158.643, "memory_gbps": 36.486, "shared_write_mbps": 1266.487}}
THROTTLED = {"worker1": {"compute_gflops": 52.37, "memory_gbps": 28.205, "shared_write_mbps": 439.459},
             "worker2": {"compute_gflops": 19.567, "memory_gbps": 11.015, "shared_write_mbps": 540.642}}


def test_nodes_that_keep_pace_pass_with_their_figures():
    verdicts = health.health_verdicts(HEALTHY)
    assert [(v["host"], v["status"]) for v in verdicts] == [("worker1", "pass"), ("worker2", "pass")]
    assert verdicts[0]["detail"] == "156 GFLOP/s, 42.6 GB/s, 1286 MB/s"


def test_a_node_far_below_its_peers_fails_with_the_figure_and_the_fix():
    verdicts = health.health_verdicts(THROTTLED)
    assert [(v["host"], v["status"]) for v in verdicts] == [("worker1", "pass"), ("worker2", "fail")]
    bad = verdicts[1]
    assert bad["check"] == "health"
    assert bad["detail"] == ("worker2 computes 19.6 GFLOP/s, 37% of the other nodes' median 52.4 GFLOP/s; worker2 "
                             "copies memory at 11 GB/s, 39% of the other nodes' median 28.2 GB/s")
    assert bad["fix"].startswith("check what else runs on it, its CPU or GPU clocks and cooling")
    assert bad["fix"].endswith("or run without it (-e exclude=worker2), or -e preflight_health_action=warn")
    assert health.health_verdicts(THROTTLED, action="warn")[1]["status"] == "warn"
    assert all(v["status"] == "pass" for v in health.health_verdicts(THROTTLED, fraction=0.25))


def test_a_node_below_its_own_past_is_named_and_refused_only_without_peers():
    past = {"worker1": [HEALTHY["worker1"]] * 3, "worker2": [HEALTHY["worker2"]] * 2}
    slow = {"worker1": {"compute_gflops": 60.0}, "worker2": {"compute_gflops": 58.0}}
    verdicts = health.health_verdicts(slow, past)
    # worker1 has three past figures (a reference), worker2 only two; its peer is as slow: the whole cluster is slower
    # now (another load), so it is named, not refused.
    assert [v["status"] for v in verdicts] == ["warn", "pass"]
    assert verdicts[0]["detail"] == ("worker1 computes 60 GFLOP/s, 38% of its own median 156 GFLOP/s over its last "
                                     "3 passing preflights")
    # Alone in the job, its past is the only reference: refused.
    assert health.health_verdicts({"worker1": slow["worker1"]}, past)[0]["status"] == "fail"


def test_a_node_that_could_not_measure_is_a_warning_and_the_history_keeps_the_newest():
    figures = health.parse({"rc": 1, "stderr": "ModuleNotFoundError: No module named 'numpy'", "stdout": ""})
    assert figures == {"error": "ModuleNotFoundError: No module named 'numpy'"}
    assert health.health_verdicts({"worker1": figures})[0]["status"] == "warn"
    assert health.parse({"rc": 0, "stdout": "noise\n" + json.dumps(HEALTHY["worker1"])}) == HEALTHY["worker1"]
    assert health.parse({"rc": 0, "stdout": "no json"}) == {"error": "no figures in its output"}
    assert health.parse({"skipped": True}) is None
    history = {}
    for n in range(12):
        history = health.updated_history(history, {"worker1": {"compute_gflops": n + 1.0, "host": "w1"},
                                                   "worker2": {"error": "x"}})
    assert [h["compute_gflops"] for h in history["worker1"]] == [float(n) for n in range(3, 13)]
    assert "worker2" not in history and history["worker1"][0] == {"compute_gflops": 3.0}


def test_a_slow_shared_directory_write_or_memory_copy_is_named_not_refused():
    # Under the suite's load a healthy worker once copied memory at 39% of its peer's rate.
    slow_copy = {"worker1": dict(HEALTHY["worker1"], memory_gbps=15.9), "worker2": dict(HEALTHY["worker2"])}
    assert [v["status"] for v in health.health_verdicts(slow_copy)] == ["warn", "pass"]
    figures = {"worker1": dict(HEALTHY["worker1"]), "worker2": dict(HEALTHY["worker2"], shared_write_mbps=90.0)}
    verdicts = health.health_verdicts(figures)
    assert verdicts[1]["status"] == "warn" and verdicts[1]["detail"].startswith(
        "worker2 writes to the shared directory at 90 MB/s, 7% of the other nodes' median 1286 MB/s")


def test_the_history_file_is_read_whole_or_not_at_all_and_errors_add_nothing(tmp_path):
    from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight import report

    assert report.load_history(str(tmp_path / "absent.json")) == {}
    (tmp_path / "torn.json").write_text("{")
    assert report.load_history(str(tmp_path / "torn.json")) == {}
    assert health.updated_history({}, {"worker1": {"error": "x"}}) == {}
    assert health.updated_history({}, THROTTLED)["worker2"] == [THROTTLED["worker2"]]
