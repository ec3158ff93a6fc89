"""The watch's hardening (issue 26, points 9, 10 and 12) on the local cluster: a coordinator that does not answer
for a few seconds does not end the run; a Slurm job that waits in the queue longer than the startup allowance is
not a stall; Ctrl-C stops every node through the dead man's switch when Ansible logs in as a user that is not the
run's (``deploy``, with sudo, as in inventories/examples)."""
import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from e2e_nodes import (INVENTORY, NODES, finish, left_on, load_summary, node_name, on_coord, podman, start_train,
                       when_step)

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
TINY = ["-e", "model=llama-tiny", "-e", "preflight=false"]


def run_left(node, run_id):
    """The run's processes on ``node`` by their command lines (a process started through deploy's sudo may hide
    its environment from the container's root, so run_processes cannot see it); not the switch's shell."""
    script = f"ps -eo pid=,args= | grep -F -e '{run_id}' | grep -v -e 'read -r why' -e grep || true"
    return podman("exec", node_name(node), "sh", "-c", script).stdout.split("\n")[:-1]


def close_masters(cp_dir):
    """End the SSH ControlMasters that this test's playbook opened (its own ControlPath directory)."""
    for sock in Path(cp_dir).glob("*"):
        os.system("ssh -O exit -o ControlPath=%s x >/dev/null 2>&1" % sock)


# A rank that runs for as long as it is told (its last argument, seconds), whatever the machine's speed: the
# bundled trainer's 40 steps take under a second here, less than one look of when_step.
RUNS_FOR = """import os, sys, time
open(os.path.join(os.environ["MULTINODE_DS_RUN_DIR"], "running-%s" % os.environ["RANK"]), "w").close()
time.sleep(float(sys.argv[-1]))
"""


def test_a_coordinator_that_does_not_answer_for_seconds_does_not_end_the_run(provisioned):
    """Point 9: the coordinator's sshd stops for ~8 s mid-run (its running sessions stay): the status calls fail
    (connection refused), the watch tries again with backoff, and the run ends well."""
    run_id = f"e2e-flaky-status-{int(time.time())}"
    script = "/shared/user/runs_for.py"
    res = podman("exec", "-i", node_name("coord"), "sh", "-c", f"mkdir -p /shared/user && chown deepspeed /shared/user && "
                 f"cat > {script}", input=RUNS_FOR)
    assert res.returncode == 0, res.stderr
    # Its own ControlPath directory, short: a socket's path has at most 107 bytes (tmp_path's are too long).
    cp_dir = Path(tempfile.mkdtemp(prefix="cp", dir="/tmp"))
    os.environ["ANSIBLE_SSH_ARGS"] = ("-o ControlMaster=auto -o ControlPersist=120s -o ServerAliveInterval=15 "
                                      "-o ControlPath=%s/%%C" % cp_dir)
    try:
        # The ranks run 30 s: the 8 s without sshd, the watch's backoff after it, and some to spare.
        proc, out, log = start_train(["-e", "preflight=false", "-e", f"entrypoint={script}", "-e", "args=30",
                                      "-e", f"run_id={run_id}"], "flaky-status")
    finally:
        del os.environ["ANSIBLE_SSH_ARGS"]
    pid = on_coord("cat /run/sshd.pid").stdout.strip()
    assert pid.isdigit()
    running = f"test -e /shared/runs/{run_id}/running-0 && test -e /shared/runs/{run_id}/running-1"
    try:
        deadline = time.time() + 300
        while time.time() < deadline and on_coord(running).returncode != 0:
            time.sleep(0.5)
        assert on_coord(running).returncode == 0, "the run never started: " + log.read_text()[-3000:]
        on_coord(f"kill {pid}")
        close_masters(cp_dir)
        time.sleep(8)
    finally:
        on_coord("/usr/sbin/sshd -E /var/log/sshd.log")
    assert on_coord("cat /run/sshd.pid").stdout.strip() not in ("", pid), "sshd did not start again"
    rc = finish(proc, out)
    close_masters(cp_dir)
    shutil.rmtree(cp_dir, ignore_errors=True)
    text = log.read_text()
    assert rc == 0, text[-3000:]
    assert text.count("trying again in") >= 2, text[-3000:]
    assert load_summary(run_id)["status"] == "success"


def test_a_slurm_job_waiting_in_the_queue_is_not_a_stall(slurm):
    """Point 10: another job holds both nodes for 60 s; the run's job waits PENDING behind it, longer than
    startup_timeout=40 (the ranks' own start takes ~20 s here), then runs: success, and the progress line said it
    was queued."""
    run_id = f"e2e-queued-{int(time.time())}"
    blocker = on_coord("sbatch --parsable --exclusive -N2 -o /dev/null --wrap 'sleep 60'").stdout.strip()
    assert blocker.isdigit()
    try:
        proc, out, log = start_train(["-e", "backend=slurm", *TINY, "-e", "steps=10", "-e", "startup_timeout=40",
                                      "-e", f"run_id={run_id}"], "slurm-queued")
        rc = finish(proc, out)
    finally:
        on_coord(f"scancel {blocker}")
    text = log.read_text()
    assert rc == 0, text[-3000:]
    assert "queued: PENDING (" in text
    summary = load_summary(run_id)
    assert summary["status"] == "success"
    queue = json.loads(on_coord(f"cat /shared/runs/{run_id}/control/queue.json").stdout)
    assert queue["state"] == "started" and queue["started"] - queue["since"] > 40


@pytest.fixture
def deploy_inventory(provisioned, tmp_path):
    """The local cluster as inventories/examples log in: as ``deploy`` (passwordless sudo, the cluster's key),
    become root for the tasks, the run's own user for the run's files."""
    script = ("id deploy >/dev/null 2>&1 || useradd -m -s /bin/sh deploy; mkdir -p ~deploy/.ssh; "
              "cp /root/.ssh/authorized_keys ~deploy/.ssh/; chown -R deploy: ~deploy/.ssh; chmod 700 ~deploy/.ssh; "
              "echo 'deploy ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/deploy; chmod 440 /etc/sudoers.d/deploy")
    for node in NODES:
        res = podman("exec", node_name(node), "sh", "-c", script)
        assert res.returncode == 0, res.stderr
    hosts = yaml.safe_load(INVENTORY.read_text())
    # In a group of their own, as in the examples: the implicit localhost (the "all" group's) does not become.
    hosts["all"]["children"] = {"cluster": {"vars": {"ansible_user": "deploy", "ansible_become": True},
                                            "children": hosts["all"]["children"]}}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(hosts))
    return path


def stop_at_step_3(inventory, name, stop, what, extra=()):
    """A long run through ``inventory``, stopped with ``stop(pid of ansible-playbook)`` at step 3; returns its run id,
    its log and what of it is still running on the nodes 10 s later."""
    run_id = f"e2e-{name}-{int(time.time())}"
    proc, out, log = start_train(["-i", str(inventory), *TINY, "-e", "steps=100000", "-e", f"run_id={run_id}",
                                  *extra], name)
    try:
        stopped = when_step(run_id, 3, lambda: stop(proc.pid))
        assert stopped, "the run never started: " + log.read_text()[-3000:]
        left = left_on(NODES, run_id, 10, look=run_left)
        print(f"every node clean {time.time() - stopped:.1f}s after {what}")
    finally:
        finish(proc, out, timeout=120)
    return run_id, log, left


def test_ctrl_c_stops_every_node_through_abort_when_ansible_logs_in_as_deploy(deploy_inventory):
    """Point 12: Ctrl-C during the watch: every node stops within 10 s, through the ABORT record (not the lease,
    which takes longer), written as the run's user although Ansible logs in as deploy.  With secret_env (issue 44,
    point 14): deploy becomes the run's account to hand it the secrets file, which needs acl on the nodes (the stack
    role installs it)."""
    run_id, log, left = stop_at_step_3(deploy_inventory, "deploy-ctrlc", lambda pid: os.killpg(pid, signal.SIGINT),
                                       "Ctrl-C", extra=["-e", '{"secret_env": {"E2E_SECRET": "x"}}'])
    assert left == {}, f"still running 10s after Ctrl-C: {left}"
    abort = json.loads(on_coord(f"cat /shared/runs/{run_id}/control/ABORT").stdout)
    assert abort["host"] == "controller" and "lease" not in abort["reason"], abort
    owner = on_coord(f"stat -c %U /shared/runs/{run_id}/control/ABORT").stdout.strip()
    assert owner != "deploy"
    assert_stopped_by_abort(run_id)
    assert "dead man's switch failed" not in log.read_text()


def kill_controller(pid):
    """SIGKILL ansible-playbook and its workers (a worker runs in a session of its own): nothing of the watch
    runs any cleanup."""
    workers = [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    os.killpg(pid, signal.SIGKILL)
    for worker in workers:
        try:
            os.kill(worker, signal.SIGKILL)
        except ProcessLookupError:
            pass


def assert_stopped_by_abort(run_id):
    """Every agent's heartbeat says it stopped for the ABORT record ("aborted"), not for a stale lease."""
    for node in NODES:
        beat = json.loads(on_coord(f"cat /shared/runs/{run_id}/nodes/{node}.json").stdout)
        assert beat["state"] in ("stopping", "aborted") and beat["reason"] == "aborted", beat


def test_a_killed_controller_stops_every_node_through_the_switch_as_the_runs_user(deploy_inventory):
    """Point 12, the switch alone: ansible-playbook SIGKILLed during the watch (no cleanup runs): the switch's
    session writes ABORT through the become (as deploy it could not: the run's user owns control/), so every node
    stops within 10 s, not after the lease's 45 s."""
    run_id, log, left = stop_at_step_3(deploy_inventory, "deploy-kill", kill_controller, "SIGKILL")
    assert left == {}, f"still running 10s after the controller was killed: {left}"
    abort = json.loads(on_coord(f"cat /shared/runs/{run_id}/control/ABORT").stdout)
    assert abort["reason"] == "the controller went away (interrupted or killed)", abort
    assert_stopped_by_abort(run_id)
