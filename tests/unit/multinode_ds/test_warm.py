"""multinode_ds/warm.py: ranks forked from a node's warm process start as a cold interpreter would (argv, cwd,
environment, sys.path, exit status, signals), see nothing of an earlier run, are found and stopped by the node's
agent, and start cold, saying why, when the warm process is stale, unsafe to fork, absent or refused."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multinode_ds import agent, rank, warm

PACKAGE = Path(warm.__file__).resolve().parent
SCRIPT = """import json, os, sys
out = {"argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "start": os.environ.get("MULTINODE_DS_START"),
       "torch": sys.modules.get("torch") is not None, "probe": "leakprobe" in sys.modules,
       "umask": oct(os.umask(0o22)), "extra": [p for p in sys.path if p.endswith("extra-path")],
       "pid": os.getpid(), "bytecode": sys.dont_write_bytecode, "var": os.environ.get("SOME_VAR")}
print(json.dumps(out))
if os.environ.get("IMPORT_PROBE"):
    import leakprobe
if os.environ.get("SLEEP"):
    import subprocess, time
    subprocess.Popen(["sleep", "60"])
    time.sleep(60)
sys.exit(int(os.environ.get("RC", "0")))
"""


def fake_stack(lib: Path, cuda_initialized=False):
    """A node package copy beside tiny torch/deepspeed/transformers stand-ins (fast to import; torch's CUDA state as
    given)."""
    shutil.copytree(PACKAGE, lib / "multinode_ds", ignore=shutil.ignore_patterns("__pycache__"))
    (lib / "torch").mkdir()
    (lib / "torch" / "__init__.py").write_text("from . import cuda\nLOADED_IN_WARM = True\n")
    (lib / "torch" / "cuda.py").write_text("def is_initialized():\n    return %r\n" % cuda_initialized)
    for name in ("deepspeed", "transformers"):
        (lib / name).mkdir()
        (lib / name / "__init__.py").write_text("")


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A node's warm directory and a driver that plays the agent (ensure) and a rank (run) from a package copy."""
    lib = tmp_path / "lib"
    lib.mkdir()
    fake_stack(lib)
    home = tmp_path / "warm"
    work = tmp_path / "work"
    work.mkdir()
    (work / "script.py").write_text(SCRIPT)
    (work / "leakprobe.py").write_text("X = 1\n")
    monkeypatch.setenv(warm.DIR_VAR, str(home))
    state = {"lib": lib, "home": home, "work": work, "procs": []}
    yield state
    # Nothing of the test runs on: its warm processes (found by their directory) and their ranks.
    needle = ("%s=%s" % (warm.DIR_VAR, home)).encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/environ" % entry, "rb") as fh:
                    if needle in fh.read().split(b"\0"):
                        os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass
    for pid in warm.registered(base=str(home)):
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


def env_of(node, **more):
    env = {"PATH": os.environ["PATH"], "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", warm.DIR_VAR: str(node["home"]),
           "MULTINODE_DS_RUN_ID": "run-1", "RANK": "0"}
    env.update(more)
    return env


DRIVER = """import json, os, sys
from multinode_ds import warm
req = json.loads(sys.argv[1])
if req.get("ensure"):
    print(json.dumps({"ensure": warm.ensure(sys.executable, req["env"], idle=req.get("idle", 30))}), flush=True)
try:
    status = warm.run([sys.executable, "-u"] + req["argv"], req["env"], req["cwd"])
    print(json.dumps({"status": status}), flush=True)
except warm.Refused as exc:
    print(json.dumps({"refused": str(exc)}), flush=True)
"""


def drive(node, argv, env, ensure=True, wait=True, **kw):
    """Run the driver (a rank's multinode_ds.rank, and first the agent's ensure) with the package copy: its output
    lines (the rank's own, then the driver's JSON answer)."""
    req = {"ensure": ensure, "env": env, "argv": argv, "cwd": str(node["work"])}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(req)], cwd=str(node["work"]),
                            env=dict(os.environ, PYTHONPATH=str(node["lib"]), **{warm.DIR_VAR: str(node["home"])}),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=60)
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")], err


def test_a_warm_rank_starts_as_a_cold_interpreter_would(node):
    extra = node["work"] / "extra-path"
    lines, err = drive(node, ["script.py", "--local_rank=0", "a b", "$(x)"],
                       env_of(node, RC="3", PYTHONPATH=str(extra), PYTHONDONTWRITEBYTECODE="1", SOME_VAR="v",
                              MULTINODE_DS_START="warm"))
    assert lines[0]["ensure"] == "starting", err
    seen = lines[1]
    assert seen["argv"] == ["script.py", "--local_rank=0", "a b", "$(x)"]
    assert (seen["cwd"], seen["path0"]) == (str(node["work"]), str(node["work"]))
    assert seen["extra"] == [str(extra)] and seen["bytecode"] is True and seen["var"] == "v"
    # Forked: torch came from the warm process; and the rank's exit code is the driver's answer.
    assert seen["start"] == "warm" and seen["torch"] is True and lines[2] == {"status": 3}, (lines, err)


def test_nothing_of_one_run_is_seen_by_the_next(node):
    lines = drive(node, ["script.py"], env_of(node, IMPORT_PROBE="1"))[0]
    assert lines[1]["probe"] is False and lines[2] == {"status": 0}
    lines = drive(node, ["script.py"], env_of(node), ensure=False)[0]
    # The second run's rank forked from the same warm process, which never imported the first run's module.
    assert lines[0]["probe"] is False and lines[1] == {"status": 0}, lines
    assert [lines[0]["pid"]] != [None]


def test_a_module_rank_runs_as_python_dash_m(node):
    (node["work"] / "mymod.py").write_text(SCRIPT)
    lines, err = drive(node, ["-m", "mymod", "--x"], env_of(node))
    assert lines[1]["argv"][0] == str(node["work"] / "mymod.py") and lines[1]["argv"][1:] == ["--x"], err
    assert lines[1]["path0"] == str(node["work"])


def test_a_signal_to_the_rank_process_reaches_the_forked_rank_and_its_end_is_passed_on(node):
    drive(node, ["script.py"], env_of(node))  # a warm process, ready
    proc = drive(node, ["script.py"], env_of(node, SLEEP="1"), ensure=False, wait=False)
    found = wait_for(lambda: [p for p, r in warm.registered(base=str(node["home"])).items()
                              if r["run_id"] == "run-1"])
    child = found[0]
    assert warm.registered(base=str(node["home"]))[child]["rank"] == "0"
    # The agent finds the forked rank and the process it started (not by its /proc environ: the warm one's).
    pids = wait_for(lambda: [p for p in agent.run_pids("run-1") if p != child])
    assert child in agent.run_pids("run-1") and pids
    assert agent.proc_rank(child) == 0
    # ps and pkill -f see the rank's command line, not the warm process's.
    with open("/proc/%d/cmdline" % child, "rb") as fh:
        words = [w.decode() for w in fh.read().split(b"\0") if w]
    assert words == [sys.executable, "-u", "script.py"], words
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    for pid in pids:  # the rank's own child holds the output pipe: what the agent stops after a run
        os.kill(pid, signal.SIGKILL)
    out = proc.communicate(timeout=30)[0]
    assert json.loads(out.splitlines()[-1]) == {"status": -signal.SIGTERM}
    assert wait_for(lambda: not alive(child))


def test_a_rank_process_killed_outright_takes_its_forked_rank_with_it(node):
    drive(node, ["script.py"], env_of(node))
    proc = drive(node, ["script.py"], env_of(node, SLEEP="1"), ensure=False, wait=False)
    child = wait_for(lambda: list(warm.registered(base=str(node["home"]))))[0]
    proc.kill()
    proc.wait(timeout=30)
    assert wait_for(lambda: not alive(child))
    assert wait_for(lambda: warm.registered(base=str(node["home"])) == {})


# A stand-in for DeepSpeed's per-node launcher: what it was given, and whether torch was imported before it ran.
LAUNCH = """import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "torch": "torch" in sys.modules, "cwd": os.getcwd(),
                  "start": os.environ.get("MULTINODE_DS_START")}), flush=True)
sys.exit(int(os.environ.get("RC", "0")))
"""


def test_deepspeeds_node_launcher_forks_from_the_warm_process_and_starts_cold_without_one(node):
    launcher = node["lib"] / "deepspeed" / "launcher"
    launcher.mkdir()
    (launcher / "__init__.py").write_text("")
    (launcher / "launch.py").write_text(LAUNCH)
    # (LANG set: an interpreter in the C locale sets LC_CTYPE in its own environment, which the key holds.)
    env = env_of(node, RC="4", PYTHONPATH=str(node["lib"]), LANG="C.UTF-8")
    del env["RANK"]  # a launcher, not a rank

    def launch():
        proc = subprocess.run([sys.executable, "-u", "-m", "multinode_ds.node_launcher", "--node_rank=1", "a b"],
                              env=env, cwd=str(node["work"]), capture_output=True, text=True, timeout=60, check=False)
        return proc.returncode, json.loads(proc.stdout.splitlines()[-1]), proc.stderr

    # No warm process for this environment: DeepSpeed's launcher starts cold, with what it was given, and says so.
    rc, seen, err = launch()
    assert (rc, seen["argv"], seen["torch"], seen["cwd"]) == (4, ["--node_rank=1", "a b"], False, str(node["work"]))
    assert "DeepSpeed's launcher starts cold: no warm process on this node" in err
    # With one (the agent's ensure, then a rank): the launcher is forked from it, torch imported already.
    drive(node, ["script.py"], dict(env, RANK="0"))
    rc, seen, err = launch()
    assert (rc, seen["argv"], seen["torch"], seen["cwd"]) == (4, ["--node_rank=1", "a b"], True, str(node["work"])), err
    assert "cold" not in err and seen["start"] is None, err


def test_a_changed_stack_starts_cold_and_says_why(node):
    lines = drive(node, ["script.py"], env_of(node))[0]
    assert lines[2] == {"status": 0}
    # A new trainer (or a package added to the venv) since the warm process imported.
    changed = node["lib"] / "multinode_ds" / "models.py"
    changed.write_text(changed.read_text() + "\n# changed\n")
    lines = drive(node, ["script.py"], env_of(node), ensure=False)[0]
    assert "changed since the warm process started" in lines[0]["refused"], lines
    # The stale one exits; the next run's agent starts a new one, whose ranks are warm again.
    lines, err = drive(node, ["script.py"], env_of(node))
    assert lines[0]["ensure"] == "starting" and lines[2] == {"status": 0}, (lines, err)


def test_a_warm_process_unsafe_to_fork_serves_no_rank(tmp_path, node):
    (node["lib"] / "torch" / "cuda.py").write_text("def is_initialized():\n    return True\n")
    lines = drive(node, ["script.py"], env_of(node))[0]
    assert "unsafe: it holds a CUDA context" in lines[1]["refused"], lines


def test_fork_hazards_are_threads_and_a_cuda_context(monkeypatch):
    assert warm.hazards() == [] or "threads" in warm.hazards()[0]

    class Cuda:
        @staticmethod
        def is_initialized():
            return True

    monkeypatch.setitem(sys.modules, "torch", type("Torch", (), {"cuda": Cuda}))
    assert any("CUDA context" in h for h in warm.hazards())


def test_no_warm_process_or_a_python_variable_it_cannot_apply_means_cold(node):
    lines = drive(node, ["script.py"], env_of(node), ensure=False)[0]
    assert lines[0]["refused"].startswith("no warm process on this node"), lines
    lines = drive(node, ["script.py"], env_of(node, PYTHONHASHSEED="0"))[0]
    assert "PYTHONHASHSEED set" in lines[0]["ensure"] and "PYTHONHASHSEED set" in lines[1]["refused"]


def test_another_accounts_directory_is_refused(tmp_path):
    d = tmp_path / "w"
    d.mkdir(mode=0o755)
    with pytest.raises(warm.Refused, match="not a directory of this account's only"):
        warm.private_dir(str(d), create=False)
    link = tmp_path / "l"
    link.symlink_to(d)
    with pytest.raises(warm.Refused):
        warm.private_dir(str(link), create=False)


def test_the_key_is_the_import_environment_without_secrets_or_the_runs_own():
    base = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PATH": "/v/bin"}
    key = warm.key_of("/v/python", base)
    assert warm.key_of("/v/python", dict(base, RANK="3", MULTINODE_DS_RUN_ID="x", CUDA_VISIBLE_DEVICES="1")) == key
    assert warm.key_of("/v/python", dict(base, HF_SECRET_THING="s"), skip=("HF_SECRET_THING",)) == key
    assert warm.key_of("/v/python", dict(base, OMP_NUM_THREADS="4")) != key
    assert warm.key_of("/other/python", base) != key
    assert "HF_SECRET_THING" not in warm.zygote_env(dict(base, MULTINODE_DS_RUN_ID="x"))


def test_the_rank_shim_falls_back_cold_and_says_why(tmp_path, monkeypatch, capfd):
    (tmp_path / "program.json").write_text(json.dumps([str(tmp_path / "p.py")]))
    (tmp_path / "p.py").write_text("import os\nprint('START=' + os.environ['MULTINODE_DS_START'])\n")
    (tmp_path / "rank.env").write_text("MULTINODE_DS_WARM=1\n%s=%s\n" % (warm.DIR_VAR, tmp_path / "none"))
    out = subprocess.run([sys.executable, "-m", "multinode_ds.rank", "--run-dir", str(tmp_path), "--local_rank=0"],
                         capture_output=True, text=True, timeout=60, cwd="/", check=False,
                         env=dict(os.environ, PYTHONPATH=str(PACKAGE.parent)))
    assert "START=cold: " in out.stdout and "starts cold: no " in out.stderr, (out.stdout, out.stderr)
    (tmp_path / "rank.env").write_text("")
    out = subprocess.run([sys.executable, "-m", "multinode_ds.rank", "--run-dir", str(tmp_path), "--local_rank=0"],
                         capture_output=True, text=True, timeout=60, cwd="/", check=False,
                         env=dict(os.environ, PYTHONPATH=str(PACKAGE.parent)))
    assert out.stdout.strip() == "START=cold" and "warm" not in out.stderr
    assert rank.WARM_VAR == "MULTINODE_DS_WARM"


def wait_for(fn, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.05)
    return fn()


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_the_key_leaves_out_the_run_directory_and_what_the_imports_set_themselves():
    # Seen on the local cluster: the agent's and the rank's environments differ in exactly these.
    agent_side = {"DS_ACCELERATOR": "cpu", "HOME": "/home/deepspeed", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
                  "PATH": "/opt/multinode-deepspeed/venv/bin:/usr/bin:/bin",
                  "TORCH_EXTENSIONS_DIR": "/opt/multinode-deepspeed/torch_extensions"}
    rank_side = dict(agent_side, PYTORCH_NVML_BASED_CUDA_CHECK="1", DS_ENV_FILE="/shared/runs/r1/.deepspeed_env")
    assert warm.key_of("/v/python", rank_side) == warm.key_of("/v/python", agent_side)
    assert warm.key_of("/v/python", dict(rank_side, PYTORCH_NVML_BASED_CUDA_CHECK="0")) != warm.key_of(
        "/v/python", agent_side)


def test_the_agent_retires_a_stale_warm_process_and_the_runs_ranks_fork_from_a_new_one(node):
    lines = drive(node, ["script.py"], env_of(node))[0]
    first = lines[1]["pid"]
    (node["lib"] / "multinode_ds" / "models.py").write_text("# a new trainer\n")
    lines, err = drive(node, ["script.py"], env_of(node, MULTINODE_DS_START="warm"))
    assert lines[0]["ensure"].startswith("replaced: the venv or the node package changed"), (lines, err)
    assert lines[1]["start"] == "warm" and lines[1]["torch"] is True and lines[2] == {"status": 0}
    assert lines[1]["pid"] != first
    # The retired one gave its name up and left nothing behind once it exited.
    assert wait_for(lambda: not [n for n in os.listdir(node["home"]) if ".retired-" in n])


@pytest.mark.parametrize("status", [0, 3, -signal.SIGTERM, -signal.SIGKILL, -signal.SIGINT])
def test_the_rank_process_ends_as_its_forked_rank_did(status):
    # DeepSpeed's launcher reads "exits with return code = -9" for a rank killed outright: the same from here.
    out = subprocess.run([sys.executable, "-c", "from multinode_ds import warm; warm.end_like(%d)" % status],
                         capture_output=True, text=True, timeout=30, check=False,
                         env=dict(os.environ, PYTHONPATH=str(PACKAGE.parent)))
    assert out.returncode == status, out.stderr


def test_records_of_ranks_that_are_gone_are_not_the_runs_and_a_new_warm_process_prunes_them(tmp_path):
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    (ranks / ("%d.json" % gone.pid)).write_text(json.dumps({"run_id": "r", "rank": "1", "start": 1}))
    (ranks / ("%d.json" % os.getpid())).write_text(json.dumps({"run_id": "r", "rank": "0", "start": 1}))
    me = ranks / ("%d.json" % os.getppid())
    me.write_text(json.dumps({"run_id": "r", "rank": "2", "start": warm.start_time(os.getppid())}))
    # A process that is gone, and a live PID that started at another time (reused), are not the run's.
    assert warm.registered(base=str(tmp_path)) == {os.getppid(): {"run_id": "r", "rank": "2",
                                                                  "start": warm.start_time(os.getppid())}}
    assert len(list(ranks.iterdir())) == 3
    warm.registered(base=str(tmp_path), prune=True)
    assert [p.name for p in ranks.iterdir()] == [me.name]
