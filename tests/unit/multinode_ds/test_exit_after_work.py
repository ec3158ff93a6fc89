"""How a rank's process ends once its work is done (multinode_ds.exit_after_work): exit handlers and buffered output
are kept, the interpreter's teardown is skipped, so a teardown that aborts cannot turn a finished rank into a failed
one."""
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

PROGRAM = textwrap.dedent("""
    import atexit, os, sys
    from multinode_ds import exit_after_work

    class Teardown:
        # Destroyed only in the interpreter's teardown, like a library's static object with a live thread.
        def __del__(self):
            os.abort()

    KEPT = Teardown()
    atexit.register(lambda: open(sys.argv[1], "w").write("handler ran"))
    sys.stdout.write("buffered, never flushed by hand")
    sys.stderr.write("on stderr too")
    {end}
""")


def run(tmp_path, end):
    marker = tmp_path / "atexit"
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", PROGRAM.format(end=end), str(marker)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    return proc, marker


def test_the_teardown_aborts_a_finished_process_without_it(tmp_path):
    proc, marker = run(tmp_path, "sys.exit(0)")
    assert proc.returncode == -6, (proc.returncode, proc.stderr)
    assert marker.read_text() == "handler ran"


def test_a_finished_rank_ends_with_its_code_its_output_and_its_exit_handlers(tmp_path):
    for code in (0, 3):
        proc, marker = run(tmp_path, f"exit_after_work({code})")
        assert proc.returncode == code, (proc.returncode, proc.stderr)
        assert proc.stdout == "buffered, never flushed by hand"
        assert proc.stderr == "on stderr too"
        assert marker.read_text() == "handler ran"
        marker.unlink()


def test_the_rank_programs_end_through_it():
    for module in ("train", "allreduce_perf"):
        source = (ROOT / "multinode_ds" / f"{module}.py").read_text()
        assert source.rstrip().endswith('if __name__ == "__main__":\n    exit_after_work(main())'), module
