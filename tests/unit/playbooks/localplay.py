"""The playbooks' task files run for real on localhost (controller and node at once), with the repo's ansible.cfg."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def run_local(play, *extra, timeout=300):
    """ansible-playbook ``play`` against localhost with this venv's Python: ``(exit code, stdout and stderr)``."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    res = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,",
                          "-e", "ansible_python_interpreter=" + sys.executable, *extra, str(play)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    return res.returncode, res.stdout + res.stderr
