"""A backend's parts (backends/__init__.py): each part's defaults, what a keyword argument changes, and what
``describe`` makes of them."""
import json
import os
import shlex
import subprocess
import sys
import time
from collections import OrderedDict

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends import pdsh
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.node import launcher_env
from ansible_collections.multinode.deepspeed.plugins.module_utils.common.lease import lease_timeout

JOB = {"coordinators": ["c1"], "rank_hosts": ["a", "b"], "venv": "/v", "run_dir": "/r/1", "run_id": "r",
       "timeout": 60, "master_addr": "10.0.0.1", "master_port": 29500, "slots": {"a": 1, "b": 2}}
RANK = ["--module", "multinode_ds.rank", "--run-dir", "/r/1"]
# {"a": [0], "b": [0, 1]} as DeepSpeed's runner encodes it.
WORLD = "eyJhIjogWzBdLCAiYiI6IFswLCAxXX0="


def launch_py(node_rank):
    return ["/v/bin/python", "-u", "-m", "deepspeed.launcher.launch", "--world_info", WORLD, "--node_rank",
            str(node_rank), "--master_addr", "10.0.0.1", "--master_port", "29500", "--enable_each_rank_log",
            "/r/1/logs"]


AGENT = ["/v/bin/python", "-m", "multinode_ds.agent", "--run-dir", "/r/1", "--run-id", "r", "--host"]
# What every agent gets from the plan beside its node: the run's timeout, the lease the watch's retry window derives
# (common/lease.lease_timeout) and the grace of what the run leaves running.
PLAN = ["--max-time", "60", "--lease-timeout", "%g" % lease_timeout(), "--leftover-grace", "5"]


def test_a_keyword_changes_a_parts_data_and_only_its_own():
    assert backends.Stop(signal="KILL").signal == "KILL" and backends.Stop().signal == "TERM"
    with pytest.raises(TypeError, match="Stop has no signals"):
        backends.Stop(signals="KILL")


def test_ranks_default_to_a_launcher_on_every_rank_node_and_no_ssh():
    ranks = backends.Ranks()
    assert ranks.launchers(JOB) == ["a", "b"] and ranks.agents(JOB) == ["a", "b"]
    assert ranks.ssh_agents(JOB) == ["a", "b"] and ranks.ssh_pairs(JOB) == [] and ranks.ssh_targets(JOB) == {}
    assert ranks.over_ssh is False


def test_ranks_with_one_launcher_on_the_coordinator():
    ranks = backends.Ranks(launcher_per_node=False)
    assert ranks.launchers(JOB) == ["c1"] and ranks.agents(JOB) == ["c1", "a", "b"]
    assert ranks.agents(dict(JOB, coordinators=["b", "c1"])) == ["b", "a"]


def test_agents_the_scheduler_starts_are_not_started_over_ssh():
    ranks = backends.Ranks(agents_over_ssh=False)
    assert ranks.agents(JOB) == ["a", "b"] and ranks.ssh_agents(JOB) == []
    assert ranks.secret_hosts(JOB) == [] and ranks.launcher_agents(JOB) == []


def test_agents_the_launcher_starts_are_the_rank_nodes_but_a_launchers_own():
    ranks = backends.Ranks(launcher_per_node=False, agents_by_launcher=True)
    assert ranks.agents(JOB) == ["c1", "a", "b"] and ranks.ssh_agents(JOB) == ["c1"]
    assert ranks.launcher_agents(JOB) == ["a", "b"] and ranks.secret_hosts(JOB) == ["a", "b"]
    # The coordinator is a rank node too: its agent is the launcher's, started by the play; no second one.
    job = dict(JOB, rank_hosts=["c1", "a"])
    assert ranks.ssh_agents(job) == ["c1"] and ranks.launcher_agents(job) == ["a"]
    assert ranks.secret_hosts(job) == ["c1", "a"]
    assert backends.Ranks().launcher_agents(JOB) == [] and backends.Ranks().secret_hosts(JOB) == ["a", "b"]


def test_ssh_targets_group_the_pairs_by_source():
    class Pairs(backends.Ranks):
        def ssh_pairs(self, job):
            return [("c1", "a"), ("a", "a"), ("c1", "b")]
    assert Pairs().ssh_targets(JOB) == {"c1": ["a", "b"], "a": ["a"]}


def test_start_argv_without_a_launcher_is_deepspeeds_node_launcher_on_each_node():
    start = backends.Start()
    assert start.argv(JOB, "b") == launch_py(1) + RANK
    assert start.files(JOB) == {} and start.now(JOB) is True and start.handoff(JOB) is None


def test_stop_gives_the_agent_its_signal_only_with_a_launch_and_its_sweep_only_without():
    assert backends.Stop().agent_argv(JOB, "a", ["x"]) == AGENT + ["a"] + PLAN + ["--", "x"]
    assert backends.Stop().agent_argv(JOB, "b", None) == AGENT + ["b"] + PLAN
    stop = backends.Stop(signal="KILL", sweep_after=15, leftover_grace=2.5)
    plan = PLAN[:-1] + ["2.5"]
    assert stop.agent_argv(JOB, "a", ["x"]) == AGENT + ["a"] + plan + ["--stop-signal", "KILL", "--", "x"]
    assert stop.agent_argv(JOB, "b", []) == AGENT + ["b"] + plan + ["--sweep-after", "15"]


def test_the_other_parts_default_to_nothing_of_their_own():
    assert backends.Options().read({"x": 1}, []) == {} and backends.Options().check(JOB) == []
    assert backends.Options.defaults == {}
    tasks, watch = backends.Tasks(), backends.Watch()
    assert (tasks.folder, tasks.steps, tasks.entry_points(), tasks.extra(JOB)) == (None, (), {}, {})
    assert (watch.probe_nodes, watch.follow(JOB), watch.follower({})) == (True, None, None)


def test_a_backend_of_defaults_describes_itself_from_its_parts():
    class Plain(backends.Backend):
        NAME = "plain"
    launch = Plain().describe(JOB)
    assert list(launch) == ["name", "launchers", "agents", "argv", "agent_argv", "ssh_pairs", "ssh_targets",
                            "ranks_over_ssh", "ssh_agents", "secret_hosts", "stop", "steps", "files", "start", "handoff",
                            "reuse_lost", "follow", "probe_nodes", "extra"]
    assert launch["name"] == "plain" and launch["launchers"] == ["a", "b"] and launch["stop"] == "lease"
    assert launch["secret_hosts"] == ["a", "b"]
    assert launch["argv"]["a"] == launch_py(0) + RANK
    assert launch["agent_argv"]["b"] == AGENT + ["b"] + PLAN + ["--"] + launch["argv"]["b"]
    assert (launch["steps"], launch["follow"], launch["extra"]) == ({}, None, {})


def test_a_backends_steps_are_entry_points_of_role_backend():
    tasks = backends.Tasks(folder="sched", steps=("preflight", "recover"))
    assert tasks.entry_points() == {"preflight": "sched/preflight", "recover": "sched/recover"}
    with pytest.raises(ValueError, match="sched: unknown backend steps submit"):
        backends.Tasks(folder="sched", steps=("preflight", "submit")).entry_points()
    with pytest.raises(TypeError, match="Tasks has no run"):
        backends.Tasks(run="sched")


def test_what_preflight_and_the_watch_ask_a_backend_comes_from_its_parts():
    default = backends.get(backends.DEFAULT)
    assert default.ranks_over_ssh is default.ranks.over_ssh is True
    assert default.ssh_pairs(JOB) == default.ranks.ssh_pairs(JOB) == [("c1", "c1"), ("c1", "a"), ("c1", "b")]
    assert default.follower({}) is None


def test_every_backends_settings_are_read_by_the_action():
    names = backends.setting_names()
    assert names == sorted(names) and {"slurm_partition", "k8s_namespace"} <= set(names)
    assert all(set(b.options.defaults) <= set(names) for b in backends.REGISTRY.values())


def test_the_world_info_is_what_deepspeeds_runner_makes_of_the_hostfile(tmp_path):
    """What ``deepspeed --hostfile H --no_ssh`` would give launch.py: DeepSpeed's own functions on the same hostfile."""
    runner = pytest.importorskip("deepspeed.launcher.runner")
    job = dict(JOB, rank_hosts=["worker2", "worker10", "worker1"], slots={"worker1": 2, "worker2": 1, "worker10": 4})
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join("%s slots=%d\n" % (h, job["slots"][h]) for h in job["rank_hosts"]))
    pool = runner.fetch_hostfile(str(hostfile))
    expected = runner.encode_world_info(runner.parse_inclusion_exclusion(pool, "", ""))
    assert backends.world_info(job) == expected
    argv = backends.Start().argv(job, "worker1")
    assert argv[argv.index("--world_info") + 1] == expected and argv[argv.index("--node_rank") + 1] == "2"


# A stand-in for the venv's python on a rank node: it prints its arguments and environment, as JSON.
FAKE_PYTHON = """#!%s
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd(),
                  "session_leader": os.getsid(0) == os.getpid(), "stdin": os.path.realpath("/proc/self/fd/0")}))
if "--ready-fd" in sys.argv and "NOT_READY" not in os.environ:  # the agent says it watches the run
    os.write(int(sys.argv[sys.argv.index("--ready-fd") + 1]), b"ready\\n")
""" % sys.executable


def wait_for_json(path, timeout=10.0):
    """The one JSON line the stand-in python wrote to ``path`` (it runs detached: wait for it)."""
    deadline = time.time() + timeout
    while True:
        text = path.read_text() if path.exists() else ""
        if text.endswith("\n") or time.time() > deadline:
            return json.loads(text)
        time.sleep(0.02)


def test_pdshs_node_command_starts_no_second_agent_on_the_launchers_node_and_pastes_no_name(tmp_path):
    """The coordinator is a rank node too: its agent is the launcher's; a node name is a quoted word."""
    run_dir, venv = tmp_path / "run 1", tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(FAKE_PYTHON)
    os.chmod(venv / "bin" / "python", 0o755)
    (run_dir / "nodes").mkdir(parents=True)
    odd = "w$(touch pwned)"
    job = dict(JOB, venv=str(venv), run_dir=str(run_dir), coordinators=["c1"], rank_hosts=["c1", odd],
               slots={"c1": 1, odd: 1})
    command = pdsh.pdsh_argv(job)[-1]
    start = command.split(" && exec ")[0].split("set +a && ")[1]
    for rank in (0, 1):
        subprocess.run(["sh", "-c", "cd %s && %s && echo started" % (shlex.quote(str(run_dir)),
                                                                     start.replace("%n", str(rank)))],
                       check=True, env={"PATH": "/usr/bin:/bin"}, cwd=str(tmp_path))
    agent = wait_for_json(run_dir / "nodes" / ("%s.agent.log" % odd))
    assert agent["argv"][agent["argv"].index("--host") + 1] == odd
    assert sorted(p.name for p in (run_dir / "nodes").iterdir()) == [odd + ".agent.log"]
    assert not (tmp_path / "pwned").exists() and not (run_dir / "pwned").exists()


def test_pdshs_node_command_starts_no_rank_when_the_nodes_agent_does_not_watch(tmp_path):
    """An agent that stops before it watches the run (a bad argument, a run already aborted, a shared directory it
    cannot write) closes its --ready-fd without a word: the node's command fails, naming it, and launch.py never
    starts (pdsh then reports the node's exit code, and the coordinator's agent aborts the run naming the node)."""
    run_dir, venv = tmp_path / "run-1", tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(FAKE_PYTHON)
    os.chmod(venv / "bin" / "python", 0o755)
    (run_dir / "nodes").mkdir(parents=True)
    (run_dir / ".deepspeed_env").write_text("MULTINODE_DS_RUN_ID=r\n")
    job = dict(JOB, venv=str(venv), run_dir=str(run_dir), coordinators=["c1"], rank_hosts=["a", "b"])
    command = pdsh.pdsh_argv(job)[-1].replace("%n", "1")
    ranks = tmp_path / "ranks-started"
    command = command.split(" && exec ")[0] + " && exec touch %s" % shlex.quote(str(ranks))
    for env, started in (({"NOT_READY": "1"}, False), ({}, True)):
        out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, cwd=str(tmp_path),
                             env=dict(env, PATH="/usr/bin:/bin"), check=False)
        assert ranks.exists() is started and out.returncode == (0 if started else 1), out
        assert ("the run's agent on b is not running (nodes/b.agent.log says why): its ranks are not started"
                in out.stderr) is not started


def test_pdsh_runs_on_each_node_what_deepspeeds_runner_would_give_pdsh(tmp_path, monkeypatch):
    """The pdsh backend's command against DeepSpeed's own ``PDSHRunner.get_cmd`` for the same hostfile, master,
    logs, program and .deepspeed_env: the same pdsh options, and on a node (both commands run by ``sh -c`` as pdsh's
    remote shell would, ``%n`` replaced by the node's index) the same directory, launch.py arguments and variables."""
    runner = pytest.importorskip("deepspeed.launcher.runner")
    multinode_runner = pytest.importorskip("deepspeed.launcher.multinode_runner")
    launch = pytest.importorskip("deepspeed.launcher.launch")
    run_dir, venv = tmp_path / "run-1", tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(FAKE_PYTHON)
    os.chmod(venv / "bin" / "python", 0o755)
    (run_dir / "nodes").mkdir(parents=True)
    env = {"MULTINODE_DS_RUN_ID": "r1", "NCCL_SOCKET_IFNAME": "eth0,eth1", "GLOO_SOCKET_IFNAME": "eth0",
           "PATH": str(venv / "bin") + ":/usr/bin:/bin", "MY_NOTE": "a b $(touch pwned)"}
    job = dict(JOB, venv=str(venv), run_dir=str(run_dir), env=env, rank_hosts=["worker2", "worker10"],
               slots={"worker2": 1, "worker10": 2})
    deepspeed_env = launcher_env(env)
    assert "MY_NOTE" not in deepspeed_env  # rank.env only (multinode_ds.rank), never a shell
    (run_dir / ".deepspeed_env").write_text("".join("%s=%s\n" % kv for kv in deepspeed_env.items()))

    ours = pdsh.pdsh_argv(job)
    args = runner.parse_args(["--hostfile", str(run_dir / "hostfile"), "--master_addr", job["master_addr"],
                              "--master_port", str(job["master_port"]), "--launcher", "pdsh", "--force_multi",
                              "--enable_each_rank_log", str(run_dir / "logs"), "--module",
                              "multinode_ds.rank", "--run-dir", str(run_dir)])
    resources = OrderedDict((h, list(range(job["slots"][h]))) for h in job["rank_hosts"])
    theirs = multinode_runner.PDSHRunner(args, runner.encode_world_info(resources))
    for key, value in deepspeed_env.items():
        theirs.add_export(key, value)
    cwd = os.getcwd()
    os.chdir(run_dir)  # the runner's cd is to its own directory: the agent starts it in the run directory
    try:
        cmd, _kill, pdsh_env = theirs.get_cmd({}, resources)
    finally:
        os.chdir(cwd)

    # pdsh's options: DeepSpeed's, with its PDSH_RCMD_TYPE=ssh as -R ssh.
    assert pdsh_env["PDSH_RCMD_TYPE"] == "ssh" and ours[2:4] == ["-R", "ssh"]
    assert ours[:2] + ours[4:-1] == cmd[:6] == ["pdsh", "-S", "-f", "1024", "-w", "worker2,worker10"]

    def on_node(command, rank):
        # pdsh joins its remote words with spaces and gives them to the login shell; %n is the node's index.
        out = subprocess.run(["sh", "-c", command.replace("%n", str(rank))], capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, cwd=str(tmp_path), check=True)
        return json.loads(out.stdout)

    def launch_args(argv):
        # What launch.py makes of its arguments (after "-u -m deepspeed.launcher.launch").
        monkeypatch.setattr(sys, "argv", ["launch.py"] + argv[3:])
        return vars(launch.parse_args())
    their_words = [str(venv / "bin" / "python") if w == sys.executable else w for w in cmd[6:]]
    for rank in (0, 1):
        mine, deepspeeds = on_node(ours[-1], rank), on_node(" ".join(their_words), rank)
        assert launch_args(mine["argv"]) == launch_args(deepspeeds["argv"])
        assert launch_args(mine["argv"])["node_rank"] == rank
        assert mine["argv"][:4] == ["-u", "-m", "deepspeed.launcher.launch", "--world_info=" + backends.world_info(job)]
        assert "--node_rank=%d" % rank in mine["argv"]
        assert mine["argv"][-3:] == ["multinode_ds.rank", "--run-dir", str(run_dir)]
        assert mine["cwd"] == deepspeeds["cwd"] == str(run_dir)
        for key, value in deepspeed_env.items():
            assert mine["env"][key] == deepspeeds["env"][key] == value
        assert "MY_NOTE" not in mine["env"]
        # Before launch.py, the node's shell started the node's agent, watching, in a session of its own.
        host = job["rank_hosts"][rank]
        agent = wait_for_json(run_dir / "nodes" / ("%s.agent.log" % host))
        assert agent["argv"] == ["-m", "multinode_ds.agent", "--run-dir", str(run_dir), "--run-id", "r", "--host",
                                 host, "--max-time", str(job["timeout"]), "--lease-timeout", "%g" % lease_timeout(),
                                 "--leftover-grace", "5", "--ready-fd", "3"]
        assert agent["cwd"] == str(run_dir) and agent["session_leader"] and agent["stdin"] == os.devnull
        assert agent["env"]["NCCL_SOCKET_IFNAME"] == "eth0,eth1" and "MY_NOTE" not in agent["env"]
    assert not (tmp_path / "pwned").exists() and not (run_dir / "pwned").exists()
    # No value of the environment is on pdsh's command line (ps shows it): the node reads the run's file.
    assert "eth0,eth1" not in " ".join(ours) and "eth0,eth1" in " ".join(cmd)
