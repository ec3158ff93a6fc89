"""Issue 44, point 1, on the local cluster: rank code that leaves links to controller paths (and a FIFO) in its run
directory reaches nothing on the controller - the file a link named report.md points to is unchanged, nothing under
runs/<id>/ is a link, MLflow holds no value of the "credentials" file a ds_config.json link points to - and the play
fails naming the rank that failed."""
import json
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]

# On rank 0: report.md and ds_config.json in the run directory become links to the controller paths given as
# arguments, a FIFO appears beside them, and the rank exits 1. Rank 1 ends well at once.
SCRIPT = """import os
import sys

paths = [a for a in sys.argv[1:] if not a.startswith("--")]
run_dir = os.environ["MULTINODE_DS_RUN_DIR"]
if os.environ.get("RANK") == "0":
    for name, target in zip(("report.md", "ds_config.json"), paths):
        place = os.path.join(run_dir, name)
        if os.path.lexists(place):
            os.unlink(place)
        os.symlink(target, place)
    os.mkfifo(os.path.join(run_dir, "pipe"))
    print("rank 0 left links to %s in %s" % (", ".join(paths), run_dir), flush=True)
    sys.exit(1)
"""


def mlflow_values(store, run_id):
    """The MLflow run logged for ``run_id``: its params, tags and metrics, read by MLflow's own client."""
    code = f"""
import json, os
os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
from mlflow.tracking import MlflowClient
c = MlflowClient("file://{store}")
e = c.get_experiment_by_name("multinode-deepspeed")
r = c.search_runs([e.experiment_id], filter_string="tags.`multinode_ds.run_id` = '{run_id}'")[0]
print(json.dumps({{"params": r.data.params, "tags": r.data.tags, "metrics": r.data.metrics}}))
"""
    out = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-c", code], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_links_a_rank_leaves_reach_nothing_on_the_controller(provisioned, run_playbook, tmp_path):
    nonce = str(time.time_ns())
    home = tmp_path / "controller"
    home.mkdir()
    notes = home / "notes.md"
    notes.write_text("the operator's own notes %s\n" % nonce)
    credentials = home / "credentials.json"
    credentials.write_text(json.dumps({"aws_secret_access_key": "SECRET-" + nonce}))
    project = tmp_path / "proj"
    project.mkdir()
    (project / "links.py").write_text(SCRIPT)
    run_id = f"e2e-links-{int(time.time())}"
    store = tmp_path / "mlruns"
    res = run_playbook("train.yml", "-e", f"workdir={project}", "-e", "entrypoint=links.py",
                       "-e", f"args='{notes} {credentials}'", "-e", "tracking=mlflow",
                       "-e", f"mlflow_tracking_uri={store}", "-e", f"run_id={run_id}", "-e", "preflight=false",
                       name="integrity-links")
    flat = " ".join(res.out.split())
    assert res.rc != 0, res.tail()
    assert "Failed first: rank 0 on worker1, exit code 1" in flat, res.tail()
    # The controller's file is as it was; the run's report is a file of the run's own.
    assert notes.read_text() == "the operator's own notes %s\n" % nonce
    run = ROOT / "runs" / run_id
    links = [os.path.join(here, n) for here, dirs, names in os.walk(run) for n in dirs + names
             if not (stat.S_ISREG(os.lstat(os.path.join(here, n)).st_mode)
                     or stat.S_ISDIR(os.lstat(os.path.join(here, n)).st_mode))]
    assert links == [], links
    summary = json.loads((run / "summary.json").read_text())
    assert {"report.md", "ds_config.json", "pipe"} <= set(summary["refused_files"]), summary["refused_files"]
    assert "## Refused files" in (run / "report.md").read_text()
    assert "Not brought back (not regular files" in flat
    # MLflow logged the failed run, and nothing of the credentials file.
    logged = mlflow_values(store, run_id)
    assert logged["tags"]["multinode_ds.status"] == "failed"
    assert nonce not in json.dumps(logged) and not [k for k in logged["params"] if k.startswith("ds_config.")]
