"""An action plugin of the collection built around a mocked task, as the strategy would hand it over (tests)."""
import subprocess
import sys
from unittest.mock import MagicMock

from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar


def action_plugin(cls, action, args, check_mode=False, connection=None):
    """``cls`` (an ActionModule) for a task of ``action`` with ``args``; its connection is ``connection`` or a mock."""
    task = MagicMock()
    task.args = args
    task.async_val = 0
    task.check_mode = check_mode
    task.diff = False
    task.action = action
    return cls(task, connection if connection is not None else MagicMock(), MagicMock(), loader=DataLoader(),
               templar=Templar(loader=DataLoader(), variables={}), shared_loader_obj=None)


def node_connection(pipelining=True):
    """A mocked connection to a node reached as a pipelined module is (or, ``pipelining=False``, not): its shell
    builds the command as the interpreter alone."""
    connection = MagicMock()
    connection.is_pipelining_enabled.return_value = pipelining
    connection._remote_is_local = False
    connection._shell.build_module_command.side_effect = lambda env, shebang, cmd: shebang[2:]
    return connection


def bare_python_node(calls, rc=None, stdout=None):
    """An action's ``_low_level_execute_command`` that runs the piped script in a Python that cannot import Ansible
    or the collection (-I: no PYTHONPATH or user site; -S: no site-packages), as on a bare node, recording each
    ``(command, sudoable)`` in ``calls``; with ``rc``, it answers ``rc`` and ``stdout`` instead."""
    def execute(cmd, sudoable=True, in_data=None, **kwargs):
        calls.append((cmd, sudoable))
        if rc is not None:
            return {"rc": rc, "stdout": stdout or "", "stderr": "boom"}
        proc = subprocess.run([sys.executable, "-I", "-S", "-"], input=in_data, capture_output=True, text=True,
                              check=False)
        return {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
    return execute


def direct_action(cls, action, args, pipelining=True, check_mode=False, **node):
    """``cls`` (a node_python.DirectAction) for a task of ``action`` with ``args``, its node a bare Python here
    (``bare_python_node``, each command in ``plugin.piped``); the module, if it runs, answers ``{"from": "module"}``
    (``plugin._execute_module`` records the call)."""
    plugin = action_plugin(cls, action, args, check_mode=check_mode, connection=node_connection(pipelining))
    plugin._task.delegate_to = None
    plugin._task.environment = []
    plugin.piped = []
    plugin._low_level_execute_command = bare_python_node(plugin.piped, **node)
    plugin._execute_module = MagicMock(return_value={"changed": False, "from": "module"})
    return plugin
