"""A workdir's private files stay private (issue 44, point 2) on the local cluster: a .env is left out, a file only
its owner may read ships (with workdir_allow_private) into a workspace that no other account of a node can read, and
-e workdir=$HOME is refused before anything on the nodes changes.  The workspace is whole (point 3): names rsync's
--files-from would take for comments (#, ;) are copied, the copy was checked against the plan's hash, and the
ranks ran in their own work/ beside it."""
import os
import time
from pathlib import Path

import pytest
from e2e_nodes import load_summary, node_name

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]

# No torch, no DeepSpeed: each rank reads the private file from its workspace (it runs as the run's account).
SCRIPT = """import os
print("rank in", os.getcwd(), "reads", open("notes.txt").read().strip(), "env", os.path.exists(".env"), flush=True)
"""


def test_home_is_refused_and_private_files_are_readable_by_the_run_account_only(provisioned, run_playbook, podman,
                                                                                tmp_path):
    home = os.path.expanduser("~")
    run_id = f"e2e-wdhome-{int(time.time())}"
    res = run_playbook("train.yml", "-e", f"workdir={home}", "-e", "entrypoint=train.py", "-e", f"run_id={run_id}",
                       "-e", "preflight=false", name="workdir-home")
    flat = " ".join(res.out.split())
    assert res.rc != 0 and f"is your home directory {os.path.realpath(home)}" in flat, res.tail()
    assert "Fix: give the directory of your project" in flat
    assert podman("exec", node_name("coord"), "test", "-e", f"/shared/runs/{run_id}").returncode != 0
    assert "TASK [Start the agent" not in res.out

    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text(SCRIPT)
    (project / ".env").write_text("WANDB_API_KEY=k-e2e\n")
    (project / "notes.txt").write_text(f"private-{time.time_ns()}\n")  # content this test's own
    (project / "notes.txt").chmod(0o600)
    (project / "#scratch.py").write_text("# a name rsync's --files-from reads as a comment unless it is ./#scratch.py\n")
    (project / ";old").write_text("x\n")
    run_id = f"e2e-wdprivate-{int(time.time())}"
    res = run_playbook("train.yml", "-e", f"workdir={project}", "-e", "entrypoint=train.py",
                       "-e", "workdir_allow_private=true", "-e", f"run_id={run_id}", "-e", "preflight=false",
                       name="workdir-private")
    assert res.rc == 0, res.tail()
    assert "1 file(s) left out because their names say they hold secrets: .env" in " ".join(res.out.split())
    summary = load_summary(run_id)
    dest = summary["workdir"]["dest"]
    assert summary["status"] == "success" and summary["workdir"]["count"] == 4
    logs = "".join(p.read_text() for p in (ROOT / "runs" / run_id / "logs").glob("*rank*.log"))
    notes = (project / "notes.txt").read_text().strip()
    assert f"rank in /shared/runs/{run_id}/work reads {notes} env False" in logs, logs[-2000:]
    # The ranks' work/ links (#scratch.py and ;old among them) stay on the cluster: no link, nothing refused.
    assert not [p for p in (ROOT / "runs" / run_id).rglob("*") if p.is_symlink()] and summary["refused_files"] == []
    # On a node: the run's account owns the workspace and alone may read it, read-only once it is marked whole;
    # the .env never left the controller.
    modes = podman("exec", node_name("worker2"), "stat", "-c", "%a %U %n", dest, f"{dest}/train.py", f"{dest}/notes.txt",
                   f"{dest}.json").stdout.split("\n")
    assert modes[:4] == [f"500 deepspeed {dest}", f"400 deepspeed {dest}/train.py",
                         f"400 deepspeed {dest}/notes.txt", f"600 deepspeed {dest}.json"], modes
    assert podman("exec", node_name("worker2"), "test", "-e", f"{dest}/.env").returncode != 0
    listing = podman("exec", node_name("worker2"), "sh", "-c", f"cd {dest} && find . | LC_ALL=C sort").stdout.split("\n")
    assert listing == [".", "./#scratch.py", "./;old", "./notes.txt", "./train.py", ""], listing
    assert "Check the copy against the plan's hash" in res.out
    for command in (["cat", f"{dest}/notes.txt"], ["ls", dest], ["cat", f"{dest}.json"]):
        denied = podman("exec", "--user", "nobody", node_name("worker1"), *command)
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, (command, denied)
