"""The run directory's files on the controller (module_utils/common/files.py): what rank code left there is read
only when it is a regular file reached without a link, never waited on, written over without following a link, and
what is not a regular file or a directory is removed and named."""
import os
import signal
import socket
import stat

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.common import files


@pytest.fixture(name="no_hang")
def no_hang_fixture():
    """A FIFO read would block for ever: fail the test after 10 s instead."""
    def ring(_signum, _frame):
        raise AssertionError("blocked on a FIFO")
    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def a_run(tmp_path):
    """A run directory and, outside it, a controller file a rank must not reach."""
    run = tmp_path / "runs" / "r1"
    (run / "logs").mkdir(parents=True)
    outside = tmp_path / "credentials.json"
    outside.write_text('{"secret": "s3cr3t"}\n')
    return run, outside


def test_a_regular_file_is_read_whole_or_its_tail(tmp_path):
    run, _outside = a_run(tmp_path)
    (run / "logs" / "a.log").write_bytes(b"0123456789")
    assert files.read_bytes(str(run / "logs" / "a.log"), str(run)) == b"0123456789"
    assert files.read_bytes(str(run / "logs" / "a.log"), str(run), limit=4, tail=True) == b"6789"
    assert files.read_bytes(str(run / "logs" / "a.log"), str(run), limit=4) == b"0123"
    assert files.read_text(str(run / "missing"), str(run)) is None
    (run / "a.json").write_text('{"a": [1]}')
    assert files.read_json(str(run / "a.json"), str(run)) == {"a": [1]}


def test_a_link_is_not_read_and_is_named(tmp_path):
    run, outside = a_run(tmp_path)
    os.symlink(str(outside), str(run / "ds_config.json"))
    refused = []
    assert files.read_json(str(run / "ds_config.json"), str(run), refused=refused) is None
    assert refused == ["ds_config.json"]
    assert files.is_regular(str(run / "ds_config.json"), str(run)) is False


def test_a_directory_link_on_the_way_is_not_gone_through(tmp_path):
    run, outside = a_run(tmp_path)
    os.symlink(str(outside.parent), str(run / "control"))
    refused = []
    assert files.read_text(str(run / "control" / "credentials.json"), str(run), refused=refused) is None
    assert refused == ["control/credentials.json"]


def test_a_fifo_or_a_socket_is_not_waited_on(tmp_path, no_hang):
    run, _outside = a_run(tmp_path)
    os.mkfifo(str(run / "logs" / "x_rank0.log"))
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(run / "rank.env"))
    refused = []
    try:
        assert files.read_text(str(run / "logs" / "x_rank0.log"), str(run), refused=refused) is None
        assert files.read_text(str(run / "rank.env"), str(run), refused=refused) is None
    finally:
        sock.close()
    assert refused == ["logs/x_rank0.log", "rank.env"]


def test_a_link_in_the_targets_place_is_replaced_and_what_it_pointed_to_is_unchanged(tmp_path):
    run, outside = a_run(tmp_path)
    os.symlink(str(outside), str(run / "report.md"))
    files.write_text(str(run / "report.md"), "# Run r1\n", str(run))
    assert outside.read_text() == '{"secret": "s3cr3t"}\n'
    assert stat.S_ISREG(os.lstat(str(run / "report.md")).st_mode)
    assert (run / "report.md").read_text() == "# Run r1\n"
    assert sorted(os.listdir(str(run))) == ["logs", "report.md"]  # no temporary file left


def test_a_directory_link_on_the_way_of_a_write_is_refused(tmp_path):
    run, outside = a_run(tmp_path)
    os.symlink(str(outside.parent), str(run / "plots"))
    with pytest.raises(files.UnsafePath, match="plots is a symbolic link"):
        files.write_bytes(str(run / "plots" / "loss.png"), b"PNG", str(run))
    assert not (outside.parent / "loss.png").exists()
    # Missing directories are made (not links).
    files.write_json(str(run / "attempts" / "2" / "recovery.json"), {"retry": True}, str(run))
    assert (run / "attempts" / "2" / "recovery.json").read_text() == '{\n  "retry": true\n}\n'


def test_a_written_file_follows_the_umask_or_the_mode_given(tmp_path):
    old = os.umask(0o027)
    try:
        files.write_text(str(tmp_path / "a"), "x")
    finally:
        os.umask(old)
    files.write_text(str(tmp_path / "b"), "x", mode=0o600)
    assert stat.S_IMODE(os.stat(str(tmp_path / "a")).st_mode) == 0o640
    assert stat.S_IMODE(os.stat(str(tmp_path / "b")).st_mode) == 0o600


def test_a_directory_in_the_targets_place_is_an_error_naming_it(tmp_path):
    (tmp_path / "summary.json").mkdir()
    with pytest.raises(files.UnsafePath, match="summary.json is a directory"):
        files.write_text(str(tmp_path / "summary.json"), "{}", str(tmp_path))
    assert os.listdir(str(tmp_path / "summary.json")) == [] and os.listdir(str(tmp_path)) == ["summary.json"]


def test_the_pull_check_removes_what_is_not_a_regular_file_and_names_it(tmp_path):
    run, outside = a_run(tmp_path)
    (run / "logs" / "x_rank0.log").write_text("ok\n")
    os.symlink(str(outside), str(run / "report.md"))
    os.symlink(str(outside.parent), str(run / "logs" / "up"))
    os.symlink("nowhere", str(run / "dangling"))
    os.mkfifo(str(run / "logs" / "pipe"))
    (run / "attempts" / "1").mkdir(parents=True)
    os.symlink(str(outside), str(run / "attempts" / "1" / "report.md"))
    assert files.refuse_specials(str(run), remove=False) == [
        "attempts/1/report.md", "dangling", "logs/pipe", "logs/up", "report.md"]
    assert os.path.lexists(str(run / "report.md"))  # only named
    assert files.refuse_specials(str(run), skip=("attempts",)) == ["dangling", "logs/pipe", "logs/up", "report.md"]
    assert sorted(os.listdir(str(run))) == ["attempts", "logs"] and os.listdir(str(run / "logs")) == ["x_rank0.log"]
    assert outside.read_text() == '{"secret": "s3cr3t"}\n' and os.path.lexists(str(run / "attempts" / "1" / "report.md"))


def test_the_names_rsync_skipped(tmp_path):
    lines = ['skipping non-regular file "report.md"', ">f+++++++++ logs/x_rank0.log",
             'skipping non-regular file "logs/pipe"', "cd+++++++++ logs/"]
    assert files.rsync_skipped(lines) == ["logs/pipe", "report.md"]
    assert files.rsync_skipped(None) == []
