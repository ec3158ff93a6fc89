"""The pull of playbooks/tasks/attempt.yml (issue 44, point 1), run as the play runs it (its synchronize options
read from the file) on a run directory rank code filled with a link to a controller file, a link to a directory, a
FIFO, a setuid file and a .rsync-filter that asks for the checkpoints: only regular files and directories come back,
no setuid bit, no checkpoint, and rsync names each thing it left behind (run_summary's pull_lines)."""
import json
import os
import stat
from pathlib import Path

import yaml

from ansible_collections.multinode.deepspeed.plugins.module_utils.common import files
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.job import pull_options

import localplay

ROOT = Path(__file__).resolve().parents[3]


def pull_task():
    """The synchronize task of attempt.yml, as the file has it."""
    tasks = yaml.safe_load((ROOT / "playbooks" / "tasks" / "attempt.yml").read_text())[0]["block"]
    found = [t for t in tasks if "ansible.posix.synchronize" in t]
    assert len(found) == 1
    return found[0]["ansible.posix.synchronize"]


def test_the_pull_brings_back_regular_files_and_directories_only(tmp_path):
    src, dest, outside = tmp_path / "shared" / "runs" / "r1", tmp_path / "runs" / "r1", tmp_path / "notes.md"
    (src / "logs").mkdir(parents=True)
    (src / "checkpoints").mkdir()
    (src / "checkpoints" / "model.pt").write_text("weights")
    (src / "logs" / "w1_rank0.log").write_text("ok\n")
    (src / "launch.sh").write_text("#!/bin/sh\n")
    os.chmod(str(src / "launch.sh"), 0o4755)
    outside.write_text("the operator's notes\n")
    os.symlink(str(outside), str(src / "report.md"))
    os.symlink(str(tmp_path), str(src / "logs" / "up"))
    os.mkfifo(str(src / "pipe"))
    (src / ".rsync-filter").write_text("+ checkpoints/\n")
    # A shipped script's work/: links into the workspace (names rsync would read as patterns or comments among
    # them) beside what the ranks wrote.
    top = ["data", "#notes.py", "*.py", "a b", "it's"]
    (src / "work").mkdir()
    for name in top:
        os.symlink(str(tmp_path / "workspace" / name), str(src / "work" / name))
    (src / "work" / "out.txt").write_text("a rank's output\n")
    train_job = {"pull_opts": pull_options({"workdir": {"top": top}})}
    args = dict(pull_task(), src="%s/" % src, dest="%s/" % dest)
    for key in ("use_ssh_args", "ssh_connection_multiplexing", "verify_host"):
        args.pop(key)
    play = [{"hosts": "localhost", "connection": "local", "gather_facts": False, "vars": {"train_job": train_job},
             "tasks": [
        {"name": "pull", "ansible.posix.synchronize": args, "register": "pull"},
        {"name": "keep its lines", "ansible.builtin.copy": {
            "content": "{{ pull.stdout_lines | to_json }}", "dest": str(tmp_path / "lines.json"), "mode": "0644"}}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    rc, out = localplay.run_local(tmp_path / "play.yml", timeout=120)
    assert rc == 0, out
    found = [os.path.relpath(os.path.join(here, n), str(dest)) for here, dirs, names in os.walk(str(dest))
             for n in dirs + names]
    assert sorted(found) == [".rsync-filter", "launch.sh", "logs", "logs/w1_rank0.log", "work", "work/out.txt"], found
    assert stat.S_IMODE(os.stat(str(dest / "launch.sh")).st_mode) == 0o755
    lines = json.loads((tmp_path / "lines.json").read_text())
    assert files.rsync_skipped(lines) == ["logs/up", "pipe", "report.md"], lines
    assert outside.read_text() == "the operator's notes\n"
