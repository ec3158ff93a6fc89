"""The agent stops only its own run: the launcher's group gets the backend's signal, the run's other processes
SIGTERM, and a process of another run is left alone."""
import os
import signal
import subprocess
import sys
import time

from multinode_ds import agent

# A stand-in for DeepSpeed's pdsh runner: on SIGTERM it would pkill every run's launchers.
LAUNCHER = ("import signal,sys,time,pathlib\n"
            "def h(*a):\n    pathlib.Path(sys.argv[1]).write_text('TERM handler ran'); sys.exit(1)\n"
            "signal.signal(signal.SIGTERM, h)\n"
            "time.sleep(60)\n")


def spawn(run_id, code, *args, new_session=True):
    env = dict(os.environ, MULTINODE_DS_RUN_ID=run_id)
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, start_new_session=new_session)


def test_the_launchers_group_is_killed_outright_and_other_runs_live(tmp_path):
    mark = tmp_path / "handler"
    launcher = spawn("run-a", LAUNCHER, str(mark))
    rank = spawn("run-a", "import time; time.sleep(60)")
    other = spawn("run-b", "import time; time.sleep(60)")
    time.sleep(0.5)
    try:
        agent.kill_all("run-a", {os.getpid()}, launcher.pid, grace=2.0, launcher_signal=signal.SIGKILL)
        assert launcher.wait(5) == -signal.SIGKILL and not mark.exists()
        assert rank.wait(5) == -signal.SIGTERM
        assert other.poll() is None
    finally:
        for p in (launcher, rank, other):
            if p.poll() is None:
                p.kill()


def test_by_default_the_launcher_gets_sigterm(tmp_path):
    mark = tmp_path / "handler"
    launcher = spawn("run-c", LAUNCHER, str(mark))
    time.sleep(0.5)
    try:
        agent.kill_all("run-c", {os.getpid()}, launcher.pid, grace=2.0)
        launcher.wait(5)
        assert mark.read_text() == "TERM handler ran"
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_the_runs_secrets_file_goes_when_the_agent_ends(tmp_path):
    """The agent runs a launcher that succeeds; the node-local secrets file the play wrote is gone after."""
    run_dir = tmp_path / "runs" / "run-s"
    (run_dir / "control").mkdir(parents=True)
    (run_dir / "control" / "lease").write_text("%f\n" % time.time())
    secrets = tmp_path / "secrets.json"
    secrets.write_text('{"K": "v"}')
    (run_dir / ".deepspeed_env").write_text("MULTINODE_DS_SECRET_ENV=%s\n" % secrets)
    rc = agent.main(["--run-dir", str(run_dir), "--host", "n1", "--interval", "0.2", "--lease-timeout", "137",
                     "--leftover-grace", "5", "--", sys.executable, "-c",
                     "import os; assert os.environ['MULTINODE_DS_SECRET_ENV']"])
    assert rc == 0 and not secrets.exists()
