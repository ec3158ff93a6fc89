"""Node-side code of multinode.deepspeed: what runs on the nodes as ranks.

This package never imports Ansible; the collection's Ansible code never imports
torch.  It is copied to every node by the ``multinode.deepspeed.stack`` role
and run as ``python -m multinode_ds.train``.
"""

__version__ = "0.1.0"


def exit_after_work(code: int) -> None:
    """End a rank's process once its work is done and written, with ``code``.

    Python's exit handlers run first (a tracker's final upload, logging's last flush), then the standard streams are
    flushed and the process ends at once, without the interpreter's and the C++ libraries' teardown.  That teardown
    can abort a rank that has already finished: a library's background thread still joinable when its static object
    is destroyed ends the process with SIGABRT ("terminate called without an active exception"), and the run would
    be reported failed after every step was saved.
    """
    import atexit
    import os
    import sys

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
