"""A collected run whose directory holds what rank code left there (module_utils/run/collected.py): a link in the
place of report.md or summary.json does not reach the controller file it points to, a FIFO does not hang the summary,
and what was refused is named in the summary, the report and the message."""
import json
import os
import signal
import stat

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.run import collected
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.report import plot_series

SECRET = '{"aws_secret_access_key": "s3cr3t"}\n'


@pytest.fixture(name="no_hang")
def no_hang_fixture():
    def ring(_signum, _frame):
        raise AssertionError("blocked on a FIFO")
    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def params(run_dir, **more):
    p = dict((k, v.get("default")) for k, v in collected.ARGUMENT_SPEC.items())
    p.update(run_dir=str(run_dir), run_id="r1", world_size=2, launcher_rc=1, wall_time=3.0, expect_metrics=False,
             plots=False)
    p.update(more)
    return p


def a_failed_run(tmp_path):
    """A run whose rank 0 exited 1, and a controller file outside the run."""
    run = tmp_path / "runs" / "r1"
    for sub in ("logs", "nodes", "control", "metrics"):
        (run / sub).mkdir(parents=True)
    (run / "hostfile").write_text("worker1 slots=1\nworker2 slots=1\n")
    (run / "logs" / "worker1_rank0.log").write_text("Traceback\nSystemExit: 1\n")
    outside = tmp_path / "home" / "notes.md"
    outside.parent.mkdir()
    outside.write_text(SECRET)
    return run, outside


def test_a_link_in_place_of_the_report_and_the_summary_leaves_the_controller_file_unchanged(tmp_path):
    run, outside = a_failed_run(tmp_path)
    for name in ("report.md", "summary.json"):
        os.symlink(str(outside), str(run / name))
    os.symlink(str(outside), str(run / "rank.env"))
    res = collected.report(params(run))
    assert outside.read_text() == SECRET
    for name in ("report.md", "summary.json"):
        assert stat.S_ISREG(os.lstat(str(run / name)).st_mode), name
    summary = json.loads((run / "summary.json").read_text())
    assert summary["refused_files"] == ["rank.env", "report.md", "summary.json"]
    assert summary["environment"] == {}  # the link's target was not read as the ranks' environment
    assert "## Refused files" in (run / "report.md").read_text() and "- `report.md`" in (run / "report.md").read_text()
    assert ("Not brought back (not regular files: links, FIFOs, sockets or devices): rank.env, report.md, "
            "summary.json") in res["message"]


def test_a_fifo_in_the_run_directory_does_not_hang_the_summary(tmp_path, no_hang):
    run, _outside = a_failed_run(tmp_path)
    os.mkfifo(str(run / "logs" / "worker2_rank1.log"))
    os.mkfifo(str(run / "control" / "ABORT"))
    os.mkfifo(str(run / "scheduler.json"))
    res = collected.report(params(run))
    assert res["summary"]["refused_files"] == ["control/ABORT", "logs/worker2_rank1.log", "scheduler.json"]
    assert not any(os.path.lexists(str(run / n)) for n in res["summary"]["refused_files"])
    assert res["summary"]["abort"] is None and "scheduler" not in res["summary"]


def test_what_the_pull_skipped_is_named_and_check_mode_removes_nothing(tmp_path, no_hang):
    run, outside = a_failed_run(tmp_path)
    os.symlink(str(outside), str(run / "report.md"))
    os.mkfifo(str(run / "fifo"))
    res = collected.report(params(run, pull_lines=['skipping non-regular file "ds_config.json"', "cd+++ logs/"]),
                           check_mode=True)
    assert res["summary"]["refused_files"] == ["ds_config.json", "fifo", "report.md"]
    assert os.path.islink(str(run / "report.md")) and os.path.lexists(str(run / "fifo"))
    assert outside.read_text() == SECRET


def test_the_plots_are_not_written_through_a_link(tmp_path):
    pytest.importorskip("matplotlib")
    run, outside = a_failed_run(tmp_path)
    os.symlink(str(outside.parent), str(run / "plots"))
    records = {0: [{"event": "step", "step": 1, "loss": 2.0, "tokens_per_sec": 1.0, "step_time": 0.1}]}
    with pytest.raises(OSError, match="plots is a symbolic link"):
        plot_series(records, {0: "worker1"}, str(run / "plots"), root=str(run))
    assert os.listdir(str(outside.parent)) == ["notes.md"]
    # The summary removes the link first: the plots go into a directory of the run's own.
    (run / "metrics" / "rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[0]))
    res = collected.report(params(run, plots=True, expect_metrics=False))
    assert os.listdir(str(outside.parent)) == ["notes.md"]
    assert "plots" in res["summary"]["refused_files"]
    assert not os.path.islink(str(run / "plots")) and (run / "plots" / "loss.png").read_bytes()[:4] == b"\x89PNG"
