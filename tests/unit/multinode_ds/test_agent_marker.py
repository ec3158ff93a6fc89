"""A run's marker cannot be forged to make the agent take another account's process for the run's (issue 26,
point 7): the agent matches its own uid as well as the marker."""
import os
import pwd
import subprocess
import time

import pytest

from multinode_ds import agent


def start(run_id, user=None):
    env = dict(os.environ, MULTINODE_DS_RUN_ID=run_id)
    preexec = None
    if user is not None:
        uid = pwd.getpwnam(user).pw_uid

        def preexec():
            os.setgid(uid)
            os.setuid(uid)
    proc = subprocess.Popen(["sleep", "30"], env=env, preexec_fn=preexec, cwd="/")
    time.sleep(0.3)
    return proc


def test_the_runs_own_process_is_found():
    proc = start("marker-own")
    try:
        assert proc.pid in agent.run_pids("marker-own")
        assert agent.run_pids("marker-other") == []
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to start a process as another account")
def test_another_accounts_process_with_the_marker_is_not_the_runs():
    proc = start("marker-forged", user="nobody")
    try:
        assert proc.pid not in agent.run_pids("marker-forged")
        # As that account would see it, it is (the uid is what tells them apart).
        assert proc.pid in agent.run_pids("marker-forged", uid=pwd.getpwnam("nobody").pw_uid)
    finally:
        proc.kill()
        proc.wait()
