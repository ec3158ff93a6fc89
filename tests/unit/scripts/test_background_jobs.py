"""The suite's background jobs (tests/background.py) and the quality gates run among them (tests/quality/gates.py):
a job's output and seconds, what the time by phase lists, and which tests start a gate."""
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

TESTS = Path(__file__).resolve().parents[2]
for where in (TESTS, TESTS / "quality"):
    if str(where) not in sys.path:
        sys.path.insert(0, str(where))
import background  # noqa: E402  # pylint: disable=wrong-import-position
import gates  # noqa: E402  # pylint: disable=wrong-import-position


@pytest.fixture(name="jobs")
def fixture_jobs(monkeypatch):
    """A registry of its own: the session's time by phase lists none of these jobs."""
    monkeypatch.setattr(background, "_jobs", {})
    return background


def test_a_job_keeps_stdout_and_stderr_apart_and_its_log_has_both(tmp_path, jobs):
    argv = ["sh", "-c", "echo out; echo err >&2; exit 3"]
    proc, seconds, log = jobs.run(argv, tmp_path / "logs" / "job.log", merge=False)
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "out\n", "err\n")
    assert seconds >= 0 and log.read_text() == "out\nerr\n"
    proc, seconds, log = jobs.run(argv, tmp_path / "merged.log")
    assert sorted(proc.stdout.split()) == ["err", "out"] and log.read_text() == proc.stdout and seconds >= 0


def test_a_job_that_makes_its_stdin_non_blocking_leaves_the_next_jobs_blocking(tmp_path, jobs):
    """ansible-playbook refuses a non-blocking stdin; the flag is on the open file, which jobs that inherited the
    session's stdin would share: each job reads a /dev/null of its own."""
    code = ("import fcntl, os, sys; flags = fcntl.fcntl(0, fcntl.F_GETFL); print(bool(flags & os.O_NONBLOCK)); "
            "fcntl.fcntl(0, fcntl.F_SETFL, flags | os.O_NONBLOCK) if sys.argv[1] == 'set' else None")
    with open(tmp_path / "shared-stdin", "w") as fh:
        fh.write("")
    with open(tmp_path / "shared-stdin") as shared:
        # The session's stdin, as every job would inherit it.
        saved = os.dup(0)
        os.dup2(shared.fileno(), 0)
        try:
            first, _s, _log = jobs.run([sys.executable, "-c", code, "set"], tmp_path / "first.log")
            second, _s, _log = jobs.run([sys.executable, "-c", code, "look"], tmp_path / "second.log")
        finally:
            os.dup2(saved, 0)
            os.close(saved)
    assert first.stdout.split() == ["False"] and second.stdout.split() == ["False"], (first.stdout, second.stdout)


def test_a_job_that_ran_past_its_time_leaves_what_it_printed(tmp_path, jobs):
    with pytest.raises(jobs.subprocess.TimeoutExpired):
        jobs.run(["sh", "-c", "echo started; sleep 30"], tmp_path / "slow.log", timeout=1)
    assert (tmp_path / "slow.log").read_text() == "started\n"


def test_the_time_by_phase_lists_the_jobs_that_ended_with_a_result(tmp_path, jobs):
    done = jobs.submit("quality ok", jobs.run, ["sh", "-c", "exit 1"], tmp_path / "ok.log")
    broken = jobs.submit("quality broken", jobs.run, ["/nonexistent/command"], tmp_path / "broken.log")
    assert done.result()[0].returncode == 1
    with pytest.raises(OSError):
        broken.result()
    durations = jobs.durations()
    assert list(durations) == ["quality ok"] and durations["quality ok"] >= 0


def test_only_the_two_gate_tests_of_test_quality_wait_for_a_gate():
    here = gates.TESTS
    session = [SimpleNamespace(name="test_ansible_test_sanity", path=here),
               SimpleNamespace(name="test_modules_have_docs", path=here),
               SimpleNamespace(name="test_ansible_test_sanity", path=here.parent / "test_other.py"),
               SimpleNamespace(name="test_ansible_lint_production_profile", path=here)]
    assert [item.name for item in gates.items(session)] == ["test_ansible_test_sanity",
                                                            "test_ansible_lint_production_profile"]


def test_a_session_without_the_gate_tests_starts_no_gate(jobs):
    assert not gates.items([SimpleNamespace(name="test_x", path=TESTS / "unit" / "test_x.py")])
    assert gates.start(["test_modules_have_docs"]) == gates.start([])
    assert not jobs._jobs  # pylint: disable=protected-access
