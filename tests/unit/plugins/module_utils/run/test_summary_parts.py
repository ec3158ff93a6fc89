"""The parts of a run's summary (module_utils/run/summary.py): per-rank records, the problems, who is blamed
first, and what the summary keeps of the nodes, the logs and the ranks' environment."""
from pathlib import Path

from ansible_collections.multinode.deepspeed.plugins.module_utils.run.diagnose import abort_host_first, first_failure
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.summary import (
    agreed_world_size, blame, hosts_by_log, launcher_problems, lost_nodes, node_report, rank_environment,
    rank_log_index, rank_problems, rank_summaries, resumed_from, step_totals)

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures" / "logs"
LAYOUT = [{"name": "worker1", "slots": 1, "first_rank": 0}, {"name": "worker2", "slots": 1, "first_rank": 1}]
# A pdsh launcher's last line for its node's failed rank (host prefix, local rank, exit code).
KILLED = "worker2: [ERROR] [launch.py:259:sigkill_handler] ['python', '--local_rank=0'] exits with return code = -9"


def records(rank, host, losses, done=True, world=2, machine=None):
    recs = [{"event": "start", "rank": rank, "host": host, "local_rank": 0, "world_size": world, "machine": machine}]
    recs += [{"event": "step", "step": i, "loss": loss, "step_time": 0.5 * (rank + 1), "tokens_per_sec": 100.0 * i,
              "host": host} for i, loss in enumerate(losses, 1)]
    return recs + ([{"event": "done", "rank": rank}] if done else [])


def test_each_rank_is_summarized_and_the_first_record_of_a_step_stands_for_it():
    ranks, steps, on_coordinator = rank_summaries(
        {1: records(1, "worker2", [4.5, 3.5], done=False), 0: records(0, "worker1", [5.0, 4.0, 3.0])},
        rank_hosts={0: "gpu-a1"})
    assert ranks[0] == {"host": "gpu-a1", "local_rank": 0, "world_size": 2, "steps": 3, "last_step": 3,
                        "finished": True, "mean_step_time": 0.5}
    assert ranks[1] == {"host": "worker2", "local_rank": 0, "world_size": 2, "steps": 2, "last_step": 2,
                        "finished": False, "mean_step_time": 1.0}
    assert sorted(steps) == [1, 2, 3] and [steps[n]["loss"] for n in (1, 2, 3)] == [5.0, 4.0, 3.0]
    assert on_coordinator == []


def test_a_rank_on_the_coordinator_is_found_by_its_host_or_its_machine():
    by_host = {0: records(0, "coord", [5.0]), 1: records(1, "worker2", [5.0])}
    assert rank_summaries(by_host, coordinator="coord")[2] == [0]
    by_machine = {0: records(0, "worker1", [5.0], machine="headnode"), 1: records(1, "worker2", [5.0])}
    assert rank_summaries(by_machine, coordinator="coord", coordinator_machine="headnode")[2] == [0]
    assert rank_summaries(by_machine, coordinator="coord", coordinator_machine="other")[2] == []


def test_rank_problems_in_their_order():
    ranks = rank_summaries({0: records(0, "w1", [5.0], world=2), 2: records(2, "w3", [5.0], done=False, world=3)})[0]
    assert agreed_world_size(ranks) is None
    assert rank_problems(ranks, expected_world_size=3) == [
        "rank 2 on w3 did not finish", "ranks disagree on the world size",
        "world size None, expected 3 from the hostfile", "no metrics from ranks 1"]
    # A user's script writes no metrics: only the disagreement counts.
    assert rank_problems(ranks, expected_world_size=3, expect_metrics=False) == ["ranks disagree on the world size"]
    agreed = rank_summaries({0: records(0, "w1", [5.0]), 1: records(1, "w2", [5.0])})[0]
    assert agreed_world_size(agreed) == 2 and rank_problems(agreed, expected_world_size=2) == []


def test_launcher_problems():
    fallback = (FIXTURES / "misc_failures.log").read_text()
    assert launcher_problems(0, fallback) == ["DeepSpeed did not find the hostfile and fell back to the local node"]
    assert launcher_problems(None) == ["the launcher's exit code is unknown (it never finished)"]
    assert launcher_problems(247, "") == ["the launcher exited with 247"]
    assert launcher_problems(0, None) == []


def test_resume_and_step_totals():
    start = {"event": "start", "rank": 0, "resumed_from": "step5", "start_step": 5}
    assert resumed_from({0: [start]}) == {"from_tag": "step5", "start_step": 5, "skipped": []}
    assert resumed_from({1: [start]}) is None
    steps = [{"step": 1, "loss": 5.0, "tokens_per_sec": 100.0}, {"step": 2, "loss": None, "tokens_per_sec": 0},
             {"step": 3, "loss": 4.0, "tokens_per_sec": 300.0}]
    assert step_totals(steps) == {"steps": 3, "last_step": 3, "first_loss": 5.0, "last_loss": 4.0, "loss_fell": True,
                                  "mean_tokens_per_sec": 200.0}
    assert step_totals([]) == {"steps": 0, "last_step": None, "first_loss": None, "last_loss": None,
                               "loss_fell": False, "mean_tokens_per_sec": None}


def test_the_node_that_raised_the_abort_is_read_first():
    logs = {"worker1": "[ERROR] ['python', '--local_rank=0'] exits with return code = 1", "worker2": KILLED}
    assert list(abort_host_first(logs, {"host": "worker2"})) == ["worker2", "worker1"]
    assert list(abort_host_first(logs, None)) == ["worker1", "worker2"]
    assert first_failure(abort_host_first(logs, {"host": "worker2"}), LAYOUT)["rank"] == 1
    assert first_failure(abort_host_first(logs, None), LAYOUT)["rank"] == 0


def test_a_rank_that_lost_its_peer_is_not_the_cause_even_when_its_node_noticed_first():
    # Real lines: worker2's rank was killed by hand; worker1's rank then died on gloo's "Connection closed by
    # peer", and worker1's launcher happened to report it first.
    logs = {"coord": (FIXTURES / "pdsh_peer_noticed_first.log").read_text()}
    ranks = {0: (FIXTURES / "rank_peer_closed.log").read_text(), 1: "user-script rank 1/2 on worker2 step 9 loss 0.9"}
    failure = first_failure(logs, LAYOUT, ranks)
    assert (failure["host"], failure["rank"], failure["signal"]) == ("worker2", 1, "SIGKILL")
    # Without the ranks' logs the first exit reported is all there is to go by.
    assert first_failure(logs, LAYOUT)["host"] == "worker1"
    # Every rank lost its peer (a network cut, every exit an error): the first exit reported is named.
    cut = {"coord": logs["coord"].replace("return code = -9", "return code = 1")}
    assert first_failure(cut, LAYOUT, {0: ranks[0], 1: ranks[0]})["host"] == "worker1"
    # A rank that raised its own error is the cause, not a peer killed by the abort that followed.
    own = {0: "RuntimeError: boom", 1: ranks[0]}
    assert first_failure(logs, LAYOUT, own)["host"] == "worker1"


def failed_summary():
    return {"status": "success", "problems": ["rank 1 on worker2 did not finish"]}


def test_a_killed_rank_is_named_first():
    failure = first_failure({"coord": (FIXTURES / "pdsh_sigkill.log").read_text()}, LAYOUT)
    summary = failed_summary()
    blame(summary, failure, None, [])
    assert summary == {"status": "failed", "problems": ["rank 1 on worker2 exited with -9 (SIGKILL)",
                                                        "rank 1 on worker2 did not finish"]}
    assert "consequence_of" not in failure


def test_a_lost_node_comes_before_the_rank_that_failed_because_of_it():
    failure = first_failure({"coord": KILLED.replace("worker2", "worker1")}, LAYOUT)
    abort = {"reason": "node worker2 stopped answering", "host": "controller", "lost": ["worker2"]}
    lost = lost_nodes(abort, ["worker2", "worker0"])
    assert lost == ["worker0", "worker2"]
    summary = failed_summary()
    blame(summary, failure, abort, lost)
    assert summary["status"] == "failed" and failure["consequence_of"] == ["worker0", "worker2"]
    assert summary["problems"][:2] == ["worker0, worker2 was lost: node worker2 stopped answering",
                                       "rank 0 on worker1 failed because its peer went away (exit code -9)"]


def test_an_abort_without_a_failed_rank_names_who_aborted():
    summary = failed_summary()
    blame(summary, None, {"reason": "interrupted on the controller", "host": "controller"}, lost_nodes(None))
    assert summary["problems"][0] == "the run was aborted by controller: interrupted on the controller"
    untouched = {"status": "success", "problems": []}
    blame(untouched, None, None, [])
    assert untouched == {"status": "success", "problems": []}


def test_what_the_summary_keeps_of_the_nodes_and_logs():
    nodes = {"w2": {"role": "watcher", "state": "aborted", "versions": {"torch": "2.1"}, "pids": [7], "time": 1.0},
             "w1": {"role": "launcher", "state": "finished", "exit_code": 0, "reason": "finished", "pids": []}}
    assert node_report(nodes) == {
        "versions": {"w1": None, "w2": {"torch": "2.1"}},
        "nodes": {"w1": {"role": "launcher", "state": "finished", "exit_code": 0, "reason": "finished",
                         "left_pids": []},
                  "w2": {"role": "watcher", "state": "aborted", "exit_code": None, "reason": None,
                         "left_pids": [{"pid": 7, "cmd": None, "stopped": False}]}},
        "left_pids": {"w2": [{"pid": 7, "cmd": None, "stopped": False}]}}
    logs = {1: "/shared/runs/r1/logs/x_rank1.log", 0: "/shared/runs/r1/logs/x_rank0.log",
            2: "/shared/runs/r1/logs/x_rank2.log"}
    assert rank_log_index(logs, {0: "w1", 1: "w1"}, "/shared/runs/r1") == {
        "0": {"host": "w1", "log": "logs/x_rank0.log"}, "1": {"host": "w1", "log": "logs/x_rank1.log"},
        "2": {"host": None, "log": "logs/x_rank2.log"}}
    assert hosts_by_log(logs, {0: "w1", 1: "w1"}) == {"w1": [0, 1], None: [2]}


def test_the_ranks_environment_masks_secrets():
    text = "HF_TOKEN=hf_abc\nNCCL_SOCKET_IFNAME=eth1\nOPTS=a=b\n# comment\nHF_TOKEN_PATH=/opt/hf_token\n"
    assert rank_environment(text) == {"HF_TOKEN": "********", "NCCL_SOCKET_IFNAME": "eth1", "OPTS": "a=b",
                                      "HF_TOKEN_PATH": "/opt/hf_token"}


def test_what_a_run_left_running_is_named_by_node_and_never_fails_it():
    """Issue 44, point 5: the agents' left_pids (stopped after the launcher's exit) in the summary and one line of
    the report; the run's status is not theirs."""
    from ansible_collections.multinode.deepspeed.plugins.module_utils.run.report import markdown
    sleep = {"pid": 41, "cmd": "sleep 300", "stopped": True}
    nodes = {"w1": {"role": "watcher", "state": "finished", "reason": "finished", "pids": [], "left_pids": [sleep]},
             "w2": {"role": "watcher", "state": "finished", "reason": "finished", "pids": [52],
                    "left_pids": [{"pid": 52, "cmd": "python -m `x`", "stopped": True}, "junk"]},
             "c": {"role": "launcher", "state": "finished", "exit_code": 0, "pids": [], "left_pids": []}}
    report = node_report(nodes)
    assert report["left_pids"] == {"w1": [sleep], "w2": [{"pid": 52, "cmd": "python -m `x`", "stopped": False}]}
    assert report["nodes"]["w1"]["left_pids"] == [sleep] and report["nodes"]["c"]["left_pids"] == []
    summary = dict(report, run_id="r1", status="success", problems=[])
    text = markdown(summary, [])
    assert "**Status: success**" in text
    assert ("Left running when the run ended, stopped by the node's agent: w1: 41 `sleep 300`; w2: 52 "
            "`python -m 'x'` (still running).") in text.splitlines()
    assert "Left running" not in markdown(dict(node_report({"c": nodes["c"]}), run_id="r1", status="success"), [])
