"""Issue 26 on the local cluster: two terminals with one run id get one run (point 6; the run directory's
permissions, point 7), and a shared disk that fills up mid-run ends the run named "disk full on ..." with nothing
left on any node (point 8)."""
import errno
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from e2e_nodes import NODES, finish, left_on, load_summary, on_coord, start_train

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
TINY = ["-e", "model=llama-tiny", "-e", "preflight=false"]
RUN_UID = 2000  # ssh_mesh_uid: the run account's uid on every node


def test_two_terminals_with_one_run_id_get_one_run(provisioned):
    """Point 6: the same -e run_id started twice at once: one play runs it, the other fails naming the run id and
    leaves the first alone (it trains to the end, each rank once). Point 7: the run directory and its control/
    belong to the run account and only it may write them."""
    run_id = f"e2e-same-id-{int(time.time())}"
    args = TINY + ["-e", "steps=20", "-e", f"run_id={run_id}"]
    plays = [start_train(args, "same-id-a"), start_train(args, "same-id-b")]
    codes = [finish(proc, out) for proc, out, _log in plays]
    texts = [" ".join(log.read_text().split()) for _proc, _out, log in plays]
    assert sorted(codes) == [0, 2], "\n\n".join(t[-3000:] for t in texts)
    lost = texts[codes.index(2)]
    assert (f"run_id={run_id} is being started by another play" in lost
            or f"run_id={run_id} exists already" in lost), lost[-3000:]
    summary = load_summary(run_id)
    assert summary["status"] == "success" and summary["world_size"] == 2, summary["problems"]
    # Each rank started once: a second launch into the same directory would have written a second start record.
    starts = on_coord(f"cat /shared/runs/{run_id}/metrics/rank*.jsonl | grep -c '\"event\": \"start\"'").stdout
    assert starts.strip() == "2"
    claims = on_coord(f"cat /shared/runs/{run_id}/control/claim").stdout.split()
    assert len(claims) == 1
    modes = on_coord(f"stat -c '%n %U %a' /shared/runs/{run_id} /shared/runs/{run_id}/control").stdout.split("\n")
    assert [m.split()[1:] for m in modes if m] == [["deepspeed", "755"], ["deepspeed", "755"]], modes


def fill(path):
    """Write zeros into ``path`` until its file system is full; returns the bytes written."""
    written = 0
    with open(path, "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * (1 << 20))
                fh.flush()
                written += 1 << 20
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return written


@pytest.fixture
def small_shared_dir(provisioned):
    """A 64 MiB tmpfs every node sees (through the cluster's host mount), as the shared directory of one run."""
    name = f"full-{int(time.time())}"
    here = ROOT / ".cache" / "mounts" / name
    here.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,mode=0755", "tmpfs", str(here)], check=True)
    try:
        for sub in ("runs", "checkpoints"):
            (here / sub).mkdir()
            os.chown(here / sub, RUN_UID, RUN_UID)
        yield here, f"/mnt/host/{name}"
    finally:
        subprocess.run(["umount", "-l", str(here)], check=False)
        here.rmdir()


def test_a_shared_disk_that_fills_up_ends_the_run_named_with_nothing_left(small_shared_dir):
    """Point 8: the run's shared directory fills up at step 10: the run ends within a minute, its first problem is
    "disk full on coord", and none of its processes is left on any node."""
    here, shared = small_shared_dir
    run_id = f"e2e-disk-full-{int(time.time())}"
    proc, out, log = start_train(TINY + ["-e", "steps=2000", "-e", f"run_id={run_id}",
                                         "-e", f"shared_dir_path={shared}"], "disk-full")
    metrics = here / "runs" / run_id / "metrics" / "rank0.jsonl"
    filled = None
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            lines = metrics.read_text().splitlines() if metrics.exists() else []
            steps = [json.loads(x).get("step", 0) for x in lines[-1:] if x.startswith("{")]
            if steps and steps[0] >= 10:
                fill(here / "filler")
                filled = time.time()
                break
            time.sleep(0.5)
        assert filled is not None, log.read_text()[-3000:]
        rc = finish(proc, out)
    finally:
        if proc.poll() is None:
            proc.kill()
    took = time.time() - filled
    text = " ".join(log.read_text().split())
    print(f"the play ended {took:.1f}s after the disk filled")
    assert rc != 0 and took < 60, text[-3000:]
    assert "disk full on coord" in text, text[-3000:]
    summary = load_summary(run_id)
    assert summary["status"] == "failed" and summary["problems"][0].startswith("disk full on coord: "), summary
    assert left_on(NODES, run_id, seconds=15) == {}
