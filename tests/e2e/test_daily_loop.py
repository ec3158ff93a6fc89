"""The daily loop (issue 23) on the local cluster: a user's workdir shipped once per content, the user's DeepSpeed
config checked by DeepSpeed before any agent starts, DeepSpeed's config assertions translated after launch, and the
metrics in TensorBoard's event files and an MLflow store."""
import glob
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from e2e_nodes import load_summary, node_name

ROOT = Path(__file__).resolve().parents[2]
FILES = Path(__file__).resolve().parent / "files" / "workdir"
VENV_PY = "/opt/multinode-deepspeed/venv/bin/python"
COPY_TASK = "Copy the workdir to the shared directory"
BEFORE_TASK = "Before the start - the preflight, the workdir"
END_TASK = "End the play on the nodes with nothing left in it"

pytestmark = pytest.mark.e2e


def make_project(tmp_path, fixed=True):
    """The user's project as a git tree: train.py importing helper.py, data/, a .gitignored large file, the seed's
    ds_config.json (fixed: train_batch_size 16 for two ranks, fp16 off, and torch's Adam in place of the optimizer
    offload's CPU Adam, which DeepSpeed compiles at a CPU worker's first launch: about 100 s of both cores here)."""
    root = tmp_path / "proj"
    shutil.copytree(FILES, root)
    (root / "data" / "nonce.txt").write_text("%s\n" % time.time_ns())  # content this test's own
    (root / "big.bin").write_bytes(b"\0" * (2 * 1024 * 1024))
    (root / ".gitignore").write_text("big.bin\n")
    if fixed:
        config = json.loads((root / "ds_config.json").read_text())
        config["train_batch_size"], config["fp16"]["enabled"] = 16, False
        del config["zero_optimization"]["offload_optimizer"]
        config["optimizer"]["params"]["torch_adam"] = True
        (root / "ds_config.json").write_text(json.dumps(config, indent=2))
    for argv in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", "-C", str(root)] + argv, check=True)
    return root


def copy_result(out, task=None):
    """How the copy task (or ``task``) ended on the coordinator: changed, skipping... (None: it did not run)."""
    found = re.search(r"TASK \[%s[^\n]*\n(?:(?!TASK \[)[^\n]*\n)*?(\w+): \[coord\]" % re.escape(task or COPY_TASK),
                      out)
    return found.group(1) if found else None


def task_seconds(out, name):
    """The seconds profile_tasks gives the task ``name``."""
    found = re.search(r"^%s[^\n]*?-+ (\d+\.\d+)s$" % re.escape(name), out, re.M)
    return float(found.group(1)) if found else None


def losses(directory):
    """The train_loss scalars of the TensorBoard event files under ``directory``, read by TensorBoard itself."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # pylint: disable=C0415
    runs = glob.glob(str(directory / "*"))
    assert len(runs) == 1, runs
    acc = EventAccumulator(runs[0])
    acc.Reload()
    return [e.value for e in acc.Scalars("Train/Samples/train_loss")]


def test_workdir_ships_once_per_content_and_trains_with_tensorboard(provisioned, run_playbook, podman, tmp_path):
    project = make_project(tmp_path)
    profile = {"ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks", "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "all"}
    runs = []
    for n in (1, 2):
        run_id = f"e2e-workdir-{n}-{int(time.time())}"
        # Relative paths are taken from where ansible-playbook runs.
        res = run_playbook(str(ROOT / "train.yml"), "-e", "workdir=proj", "-e", "entrypoint=train.py",
                           "-e", "args='--steps 4 --deepspeed_config ds_config.json --probe-workspace'",
                           "-e", "tracking=tensorboard",
                           "-e", f"run_id={run_id}", "-e", "preflight=false", name=f"workdir-{n}",
                           cwd=tmp_path, env_extra=profile)
        assert res.rc == 0, res.tail()
        runs.append((run_id, res))
    (first_id, first), (second_id, second) = runs
    summary = json.loads((tmp_path / "runs" / first_id / "summary.json").read_text())
    wd = summary["workdir"]
    assert summary["status"] == "success" and wd["copied"] is True and wd["count"] == 6
    assert wd["git"]["dirty"] is False and len(wd["git"]["commit"]) == 40
    dest = f"/shared/workspaces/{wd['id']}"
    assert summary["entrypoint"] == dest + "/train.py"
    # On the nodes: the script, its helper and data, not the ignored file; the ranks ran there.
    listing = podman("exec", node_name("worker2"), "sh", "-c", f"cd {dest} && find . -type f | sort").stdout.split()
    assert listing == ["./.gitignore", "./data/nonce.txt", "./data/points.txt", "./ds_config.json", "./helper.py",
                       "./train.py"]
    logs = "".join(p.read_text() for p in (tmp_path / "runs" / first_id / "logs").glob("*_rank*.log"))
    assert f"rank 1/2 on worker2 in /shared/runs/{first_id}/work step 4" in logs
    # The marked workspace is read-only to the ranks; what they write in their working directory comes back with
    # the run, and the links there (into the workspace) do not: nothing under runs/<id>/ is a link.
    assert "workspace read-only for rank 0" in logs and "workspace read-only for rank 1" in logs, logs[-2000:]
    got = tmp_path / "runs" / first_id
    assert sorted(p.name for p in (got / "work").iterdir()) == ["out-rank0.txt", "out-rank1.txt"]
    assert not [p for p in got.rglob("*") if p.is_symlink()] and summary["refused_files"] == []
    # The second launch of the same content copies nothing: with nothing between the checks and the agents, every
    # node's part of the first play ends after run_prepare, so neither those steps nor the copy task run.
    assert copy_result(first.out) == "changed" and BEFORE_TASK in first.out
    assert END_TASK in second.out and BEFORE_TASK not in second.out and COPY_TASK not in second.out, second.tail()
    again = json.loads((tmp_path / "runs" / second_id / "summary.json").read_text())["workdir"]
    assert again["id"] == wd["id"] and again["copied"] is False
    copy_first = task_seconds(first.out, COPY_TASK)
    print(f"copy task: {copy_first}s on the first launch, not run on the second")
    assert copy_first is not None and task_seconds(second.out, COPY_TASK) is None
    # The script's loss through DeepSpeed's monitor, in the event files collected with the run.
    assert len(losses(tmp_path / "runs" / first_id / "tensorboard")) == 4
    # A changed file is new content: a new place, copied.
    (project / "helper.py").write_text((project / "helper.py").read_text() + "# changed\n")
    run_id = f"e2e-workdir-3-{int(time.time())}"
    res = run_playbook(str(ROOT / "train.yml"), "-e", f"workdir={project}", "-e", "entrypoint=train.py",
                       "-e", "args='--steps 2 --deepspeed_config ds_config.json'", "-e", f"run_id={run_id}",
                       "-e", "preflight=false", name="workdir-3", cwd=tmp_path)
    assert res.rc == 0, res.tail()
    changed = json.loads((tmp_path / "runs" / run_id / "summary.json").read_text())["workdir"]
    assert changed["id"] != wd["id"] and changed["copied"] is True and changed["git"]["dirty"] is True
    assert copy_result(res.out) == "changed"
    # A marked workspace that something changed anyway (made writable, written) is found, removed and copied again.
    tamper = f"chmod u+w {dest}/data && echo x > {dest}/data/extra.txt"
    assert podman("exec", "--user", "deepspeed", node_name("worker1"), "sh", "-c", tamper).returncode == 0
    subprocess.run(["git", "-C", str(project), "checkout", "-q", "helper.py"], check=True)
    run_id = f"e2e-workdir-4-{int(time.time())}"
    res = run_playbook(str(ROOT / "train.yml"), "-e", f"workdir={project}", "-e", "entrypoint=train.py",
                       "-e", "args='--steps 1 --deepspeed_config ds_config.json'", "-e", f"run_id={run_id}",
                       "-e", "preflight=false", name="workdir-4", cwd=tmp_path)
    assert res.rc == 0, res.tail()
    assert f"workspace {wd['id']} was marked whole and has changed since" in " ".join(res.out.split()), res.tail()
    again = json.loads((tmp_path / "runs" / run_id / "summary.json").read_text())["workdir"]
    assert again["id"] == wd["id"] and again["copied"] is True
    listing = podman("exec", node_name("worker2"), "sh", "-c", f"cd {dest} && find . -type f | sort").stdout.split()
    assert "./data/extra.txt" not in listing and "./train.py" in listing


@pytest.mark.parametrize("backend", ["ssh-free", "slurm"])
def test_workdir_on_the_other_backends(provisioned, run_playbook, tmp_path, backend, request):
    if backend == "slurm":
        request.getfixturevalue("slurm")  # preflight=false: the test sees that Slurm's workers are idle
    make_project(tmp_path)
    run_id = f"e2e-workdir-{backend}-{int(time.time())}"
    res = run_playbook("train.yml", "-e", f"backend={backend}", "-e", f"workdir={tmp_path / 'proj'}",
                       "-e", "entrypoint=train.py", "-e", "args='--steps 3 --deepspeed_config ds_config.json'",
                       "-e", f"run_id={run_id}", "-e", "preflight=false", name=f"workdir-{backend}")
    assert res.rc == 0, res.tail()
    summary = load_summary(run_id)
    assert summary["status"] == "success" and summary["backend"] == backend
    dest = summary["workdir"]["dest"]
    logs = "".join(p.read_text() for p in (ROOT / "runs" / run_id / "logs").glob("*rank*.log"))
    work = f"/shared/runs/{run_id}/work"
    assert dest.startswith("/shared/workspaces/")
    assert f"rank 0/2 on worker1 in {work} step 3" in logs and f"rank 1/2 on worker2 in {work} step 3" in logs


def test_the_seeds_config_is_refused_before_any_agent_and_a_scripts_own_mistake_is_diagnosed(
        provisioned, run_playbook, podman, tmp_path):
    project = make_project(tmp_path, fixed=False)
    run_id = f"e2e-dscfg-{int(time.time())}"
    res = run_playbook("train.yml", "-e", f"workdir={project}", "-e", "entrypoint=train.py",
                       "-e", "args='--deepspeed_config=ds_config.json'", "-e", f"run_id={run_id}", name="dscfg-seed")
    assert res.rc != 0
    flat = " ".join(res.out.split())
    assert "checked by DeepSpeed's DeepSpeedConfig on worker1" in flat, res.tail()
    assert ("ds_config: train_batch_size 32 ≠ micro batch 4 × accumulation 2 × world 2 — set train_batch_size to 16, "
            "or remove it and DeepSpeed derives it") in flat
    # fp16 is refused where DeepSpeed's CPU accelerator has no fp16 kernels (this CPU may have AVX512-FP16).
    has_fp16 = podman("exec", node_name("worker1"), VENV_PY, "-c",
                      "import torch; print(torch.ops.mkldnn._is_mkldnn_fp16_supported())").stdout.strip()
    assert has_fp16 in ("True", "False")
    assert ("ds_config: fp16.enabled on CPU workers" in flat) == (has_fp16 == "False")
    # Nothing started, nothing written: no run directory, no agent.
    assert podman("exec", node_name("coord"), "test", "-e", f"/shared/runs/{run_id}").returncode != 0
    assert "TASK [Start the agent" not in res.out
    # The same mistake in the script's own dict: DeepSpeed asserts in the ranks, and the diagnosis words it.
    run_id = f"e2e-dscfg-inline-{int(time.time())}"
    res = run_playbook("train.yml", "-e", f"workdir={project}", "-e", "entrypoint=train.py",
                       "-e", "args='--inline-batch 32'", "-e", f"run_id={run_id}", "-e", "preflight=false",
                       name="dscfg-inline")
    assert res.rc != 0
    summary = load_summary(run_id)
    found = [d for d in summary["diagnosis"] if d["id"] == "ds-config"]
    assert found and found[0]["key"] == "train_batch_size", summary["diagnosis"]
    assert found[0]["remedy"] == "set train_batch_size to 16, or remove it and DeepSpeed derives it"
    assert "Diagnosis (ds-config): ds_config: train_batch_size 32 ≠ micro batch 4" in res.out


def test_tensorboard_and_mlflow_for_the_bundled_trainer(provisioned, run_playbook, tmp_path):
    run_id = f"e2e-tracking-{int(time.time())}"
    store = tmp_path / "mlruns"
    res = run_playbook("train.yml", "-e", "steps=5", "-e", "tracking=tensorboard,mlflow",
                       "-e", f"mlflow_tracking_uri={store}", "-e", f"run_id={run_id}", "-e", "preflight=false",
                       name="tracking")
    assert res.rc == 0, res.tail()
    summary = load_summary(run_id)
    report = (ROOT / "runs" / run_id / "report.md").read_text()
    assert f"tensorboard --logdir {ROOT / 'runs' / run_id / 'tensorboard'}" in report
    assert f"mlflow ui --backend-store-uri file://{store}" in report
    rows = [json.loads(line) for line in (ROOT / "runs" / run_id / "metrics" / "rank0.jsonl").read_text().splitlines()]
    expected = [r["loss"] for r in rows if r.get("event") == "step"]
    assert len(expected) == 5
    assert losses(ROOT / "runs" / run_id / "tensorboard") == pytest.approx(expected, rel=1e-5)
    # MLflow's own client on the store finds the run by its id, with its parameters and the loss of every step.
    code = f"""
import json, os
os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
from mlflow.tracking import MlflowClient
c = MlflowClient("file://{store}")
e = c.get_experiment_by_name("multinode-deepspeed")
r = c.search_runs([e.experiment_id], filter_string="tags.`multinode_ds.run_id` = '{run_id}'")[0]
print(json.dumps({{"params": r.data.params, "status": r.info.status,
                   "loss": [[m.step, m.value] for m in c.get_metric_history(r.info.run_id, "loss")]}}))
"""
    out = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-c", code], capture_output=True, text=True,
                         check=True).stdout
    logged = json.loads(out.strip().splitlines()[-1])
    assert logged["status"] == "FINISHED" and logged["params"]["world_size"] == "2"
    assert logged["params"]["model"] == summary["model"] and logged["params"]["backend"] == "pdsh"
    assert logged["params"]["ds_config.tensorboard.enabled"] == "true"
    assert sorted(logged["loss"]) == [[i + 1, pytest.approx(v, rel=1e-6)] for i, v in enumerate(expected)]


BAD = [
    ("workdir-missing", ["workdir=nowhere", "entrypoint=train.py"], ["workdir=nowhere does not exist"]),
    ("workdir-is-a-file", ["workdir=proj/train.py", "entrypoint=train.py"],
     ["workdir=proj/train.py is a file, not a directory", "-e workdir="]),
    ("workdir-too-large", ["workdir=proj", "entrypoint=train.py", "workdir_max_mb=0.01"],
     ["over workdir_max_mb=0.01: the biggest entries are data/ (", "add them to .gitignore or workdir_exclude"]),
    ("entrypoint-outside", ["workdir=proj", "entrypoint=../other.py"], ["entrypoint=../other.py is outside workdir"]),
    ("ds-config-not-json", ["workdir=proj", "entrypoint=train.py", "ds_config=proj/helper.py"],
     ["ds_config=proj/helper.py is not JSON", "Fix: correct the file"]),
    ("ds-config-twice", ["workdir=proj", "entrypoint=train.py", "ds_config=proj/ds_config.json",
                         "args='--deepspeed_config ds_config.json'"], ["ds_config given twice", "Fix: keep one"]),
    ("tracking-unknown", ["tracking=tensorboard,neptune"], ["tracking=neptune is not one of", "Fix: -e tracking="]),
    ("mlflow-uri-malformed", ["tracking=mlflow", "mlflow_tracking_uri=http//mlflow:5000"],
     ["mlflow_tracking_uri=http//mlflow:5000 looks like a URL without its ':' after the scheme"]),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_inputs_fail_before_the_nodes_change(provisioned, run_playbook, podman, tmp_path, case):
    name, extra, expected = case
    make_project(tmp_path)
    run_id = f"e2e-bad23-{name}-{int(time.time())}"
    before = podman("exec", node_name("coord"), "ls", "-a", "/shared/workspaces").stdout
    args = []
    for e in extra + [f"run_id={run_id}"]:
        args += ["-e", e]
    res = run_playbook(str(ROOT / "train.yml"), *args, cwd=tmp_path, name=f"bad23-{name}")
    assert res.rc != 0
    flat = " ".join(res.out.split())
    assert "The job cannot start:" in flat, res.tail()
    for fragment in expected:
        assert fragment in flat, f"{fragment!r} not in the output:\n{res.tail(30)}"
    assert podman("exec", node_name("coord"), "test", "-e", f"/shared/runs/{run_id}").returncode != 0
    assert podman("exec", node_name("coord"), "ls", "-a", "/shared/workspaces").stdout == before
