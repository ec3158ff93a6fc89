"""Warm ranks (issue 48): each rank node's agent keeps a warm process (torch, DeepSpeed and transformers imported
once) and the ranks fork from it.  A warm run and a cold one (-e warm_start=false) of the same seed train the same
losses, on pdsh and on ssh-free; a module a user's script imported in one run is not there in the next; a package
added to the venv retires the warm process, and the run's ranks fork from a new one that imported the new venv."""
import json
import time

import pytest
from e2e_nodes import ROOT, node_name, podman

pytestmark = pytest.mark.e2e
SITE_PACKAGES = "/opt/multinode-deepspeed/venv/lib/python3.11/site-packages"
PROBE = """import json, os, sys
print("PROBE " + json.dumps({"leak": "leakprobe" in sys.modules, "torch": "torch" in sys.modules,
                             "start": os.environ.get("MULTINODE_DS_START"), "rank": os.environ.get("RANK")}))
import leakprobe
"""


def records(run_id, rank):
    path = ROOT / "runs" / run_id / "metrics" / f"rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def started(run_id):
    """How each rank started (its start record's ``started``)."""
    return dict((r, [x for x in records(run_id, r) if x["event"] == "start"][0]["started"]) for r in (0, 1))


def losses(run_id):
    return [(x["step"], x["loss"]) for x in records(run_id, 0) if x["event"] == "step"]


def heartbeats(run_id):
    nodes = ROOT / "runs" / run_id / "nodes"
    return dict((h, json.loads((nodes / f"{h}.json").read_text()).get("warm")) for h in ("worker1", "worker2"))


def train(run_playbook, run_id, *extra, name):
    res = run_playbook("train.yml", "-e", f"run_id={run_id}", "-e", "steps=12", "-e", "preflight=false", *extra,
                       name=name)
    assert res.rc == 0, res.tail()
    return res


@pytest.mark.parametrize("backend", ["pdsh", "ssh-free"])
def test_warm_and_cold_ranks_train_the_same_losses(provisioned, run_playbook, backend):
    stamp = int(time.time())
    warm, cold = f"e2e-warm-{backend}-{stamp}", f"e2e-cold-{backend}-{stamp}"
    train(run_playbook, warm, "-e", f"backend={backend}", name=f"warm-{backend}")
    train(run_playbook, cold, "-e", f"backend={backend}", "-e", "warm_start=false", name=f"cold-{backend}")
    assert started(warm) == {0: "warm", 1: "warm"}, (started(warm), heartbeats(warm))
    assert all(v in ("ready", "starting") or str(v).startswith("replaced: ") for v in heartbeats(warm).values()), \
        heartbeats(warm)
    assert started(cold) == {0: "cold", 1: "cold"} and heartbeats(cold) == {"worker1": None, "worker2": None}
    assert len(losses(warm)) == 12 and losses(warm) == losses(cold), (losses(warm), losses(cold))


def test_nothing_of_a_users_script_stays_in_the_warm_process(provisioned, run_playbook, tmp_path):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "probe.py").write_text(PROBE)
    (project / "leakprobe.py").write_text("X = 1\n")
    seen = []
    for n in (1, 2):
        run_id = f"e2e-warm-user-{n}-{int(time.time())}"
        res = run_playbook(str(ROOT / "train.yml"), "-e", f"workdir={project}", "-e", "entrypoint=probe.py",
                           "-e", f"run_id={run_id}", "-e", "preflight=false", name=f"warm-user-{n}", cwd=tmp_path)
        assert res.rc == 0, res.tail()
        logs = (tmp_path / "runs" / run_id / "logs").glob("*_rank*.log")
        seen += [json.loads(line.split("PROBE ", 1)[1]) for log in logs for line in log.read_text().splitlines()
                 if "PROBE " in line]
    # Both runs' ranks forked from the warm processes (torch already imported); neither saw the module the
    # script imports, though the first run's ranks imported it.
    assert len(seen) == 4 and all(s["start"] == "warm" and s["torch"] for s in seen), seen
    assert not any(s["leak"] for s in seen), seen


def test_a_package_added_to_the_venv_retires_the_warm_process(provisioned, run_playbook):
    train(run_playbook, f"e2e-warm-before-{int(time.time())}", name="warm-before")
    probe = f"{SITE_PACKAGES}/mnds_warm_probe-1.0.dist-info"
    try:
        for node in ("worker1", "worker2"):
            res = podman("exec", node_name(node), "sh", "-c", f"mkdir -p {probe} && touch {probe}/METADATA")
            assert res.returncode == 0, res.stderr
        run_id = f"e2e-warm-changed-{int(time.time())}"
        train(run_playbook, run_id, name="warm-changed")
        beats = heartbeats(run_id)
        assert all(str(v).startswith("replaced: the venv or the node package changed") for v in beats.values()), beats
        # The ranks forked from the new warm process, which imported the venv as it is now.
        assert started(run_id) == {0: "warm", 1: "warm"}
    finally:
        for node in ("worker1", "worker2"):
            podman("exec", node_name(node), "rm", "-rf", probe)
