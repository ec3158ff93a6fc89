"""A backend's parts (backends/__init__.py): each part's defaults, what a keyword argument changes, and what
``describe`` makes of them."""
import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends

JOB = {"coordinators": ["c1"], "rank_hosts": ["a", "b"], "venv": "/v", "run_dir": "/r/1", "timeout": 60,
       "master_addr": "10.0.0.1", "master_port": 29500, "slots": {"a": 1, "b": 2}}
DEEPSPEED = ["/v/bin/deepspeed", "--hostfile", "/r/1/hostfile", "--master_addr", "10.0.0.1", "--master_port", "29500",
             "--enable_each_rank_log", "/r/1/logs"]
RANK = ["--module", "multinode_ds.rank", "--run-dir", "/r/1"]
# {"a": [0], "b": [0, 1]} as DeepSpeed's runner encodes it.
WORLD = "eyJhIjogWzBdLCAiYiI6IFswLCAxXX0="


def launch_py(node_rank):
    return ["/v/bin/python", "-u", "-m", "deepspeed.launcher.launch", "--world_info", WORLD, "--node_rank",
            str(node_rank), "--master_addr", "10.0.0.1", "--master_port", "29500", "--enable_each_rank_log",
            "/r/1/logs"]


AGENT = ["/v/bin/python", "-m", "multinode_ds.agent", "--run-dir", "/r/1", "--host"]


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


def test_ssh_targets_group_the_pairs_by_source():
    class Pairs(backends.Ranks):
        def ssh_pairs(self, job):
            return [("c1", "a"), ("a", "a"), ("c1", "b")]
    assert Pairs().ssh_targets(JOB) == {"c1": ["a", "b"], "a": ["a"]}


def test_start_argv_without_a_launcher_is_deepspeeds_node_launcher_on_each_node():
    start = backends.Start()
    assert start.argv(JOB, "b") == launch_py(1) + RANK
    assert start.files(JOB) == {} and start.now(JOB) is True and start.handoff(JOB) is None


def test_start_argv_with_a_launcher_reaches_every_node_from_one():
    assert backends.Start(launcher="mylauncher").argv(JOB, "c1") == \
        DEEPSPEED + ["--launcher", "mylauncher", "--force_multi"] + RANK


def test_stop_gives_the_agent_its_signal_only_with_a_launch_and_its_sweep_only_without():
    assert backends.Stop().agent_argv(JOB, "a", ["x"]) == AGENT + ["a", "--max-time", "60", "--", "x"]
    assert backends.Stop().agent_argv(JOB, "b", None) == AGENT + ["b", "--max-time", "60"]
    stop = backends.Stop(signal="KILL", sweep_after=15)
    assert stop.agent_argv(JOB, "a", ["x"]) == AGENT + ["a", "--max-time", "60", "--stop-signal", "KILL", "--", "x"]
    assert stop.agent_argv(JOB, "b", []) == AGENT + ["b", "--max-time", "60", "--sweep-after", "15"]


def test_the_other_parts_default_to_nothing_of_their_own():
    assert backends.Options().read({"x": 1}, []) == {} and backends.Options().check(JOB) == []
    assert backends.Options.defaults == {}
    tasks, watch = backends.Tasks(), backends.Watch()
    assert (tasks.preflight, tasks.run, tasks.extra(JOB)) == (None, None, {})
    assert (watch.probe_nodes, watch.follow(JOB), watch.follower({})) == (True, None, None)


def test_a_backend_of_defaults_describes_itself_from_its_parts():
    class Plain(backends.Backend):
        NAME = "plain"
    launch = Plain().describe(JOB)
    assert list(launch) == ["name", "launchers", "agents", "argv", "agent_argv", "ssh_pairs", "ssh_targets",
                            "ranks_over_ssh", "ssh_agents", "stop", "checks", "files", "start", "handoff", "tasks",
                            "recover", "reuse_lost", "follow", "probe_nodes", "extra"]
    assert launch["name"] == "plain" and launch["launchers"] == ["a", "b"] and launch["stop"] == "lease"
    assert launch["argv"]["a"] == launch_py(0) + RANK
    assert launch["agent_argv"]["b"] == AGENT + ["b", "--max-time", "60", "--"] + launch["argv"]["b"]
    assert (launch["checks"], launch["tasks"], launch["follow"], launch["extra"]) == (None, None, None, {})


def test_what_preflight_and_the_watch_ask_a_backend_comes_from_its_parts():
    pdsh = backends.get(backends.DEFAULT)
    assert pdsh.ranks_over_ssh is pdsh.ranks.over_ssh is True
    assert pdsh.ssh_pairs(JOB) == pdsh.ranks.ssh_pairs(JOB) == [("c1", "c1"), ("c1", "a"), ("c1", "b")]
    assert pdsh.follower({}) is None


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
