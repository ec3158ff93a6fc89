# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read a node without Ansible's module wrapper: ``node_facts``' work is one function of pure module_utils
(``provision/node_read.node_facts``), which ``plugin_utils/node_python`` runs in a plain Python start on the node,
on the interpreter and with the environment the module would get, its script piped to it as a pipelined module's.
That takes about 0.03 s of the node's CPU instead of 0.14 s: with every node of a cluster read before each launch,
the difference grows with the cluster.  Where that cannot be done as the module would (no pipelining, ``async``,
an argument the module's own check must judge, a ``~`` or ``$`` in a path the node must expand) or it does not
answer with a result, the module runs as usual and gives the same facts."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

from ansible import constants as C
from ansible.executor.interpreter_discovery import discover_interpreter
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import node_read
from ansible_collections.multinode.deepspeed.plugins.plugin_utils import node_python

MODULE = "multinode.deepspeed.node_facts"
DISCOVERED = "discovered_interpreter_python"
AUTO = ("auto", "auto_legacy", "auto_silent", "auto_legacy_silent")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(node_read.ARGUMENT_SPEC)
    _supports_check_mode = True
    _supports_async = True

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        params = self._direct_params()
        res = self._without_wrapper(params, task_vars) if params is not None else None
        if res is None:
            # As the normal action runs a module (async included).
            wrap_async = self._task.async_val and not self._connection.has_native_async
            res = self._execute_module(module_name=MODULE, module_args=self._task.args, task_vars=task_vars,
                                       wrap_async=wrap_async)
            if not wrap_async:
                self._remove_tmp_path(self._connection._shell.tmpdir)
        result.update(res)
        return result

    def _direct_params(self):
        """The module's parameters (its defaults filled in) when the function can run as the module would:
        pipelined, not async, arguments the module takes as they are (no path for the node to expand); else None."""
        if self._task.async_val or not self._is_pipelining_enabled("new"):
            return None
        checked = ArgumentSpecValidator(node_read.ARGUMENT_SPEC).validate(self._task.args)
        args = self._task.args
        paths = [args.get(k) for k, spec in node_read.ARGUMENT_SPEC.items() if spec.get("type") == "path"]
        paths += list(args.get("paths") or []) if isinstance(args.get("paths"), list) else [args.get("paths")]
        if checked.error_messages or any("~" in str(p) or "$" in str(p) for p in paths if p is not None):
            return None
        return checked.validated_parameters

    def _without_wrapper(self, params, task_vars):
        """The module's result from ``node_read.node_facts`` run on the node, or None when it did not answer with
        one (the module then runs)."""
        # The interpreter the module would run on (interpreter discovery included, as for the module).
        interpreter, discovered = self._interpreter(task_vars)
        cmd = self._connection._shell.build_module_command(self._compute_environment_string(), "#!" + interpreter, "")
        code = node_python.script(node_read.__name__, "node_facts", params)
        res = self._low_level_execute_command(cmd, sudoable=True, in_data=code)
        try:
            data = json.loads(res.get("stdout") or "")
        except ValueError:
            return None
        if res.get("rc") != 0 or not isinstance(data, dict):
            return None
        if discovered:
            data.setdefault("ansible_facts", {})[DISCOVERED] = interpreter
        return data

    def _interpreter(self, task_vars):
        """``(the Python the module would run on, whether it was discovered now)``: ``ansible_python_interpreter``
        (or the configuration's ``interpreter_python``), else the one discovered on the node before, else Ansible's
        interpreter discovery, whose answer is returned as a fact as a module's would be."""
        if getattr(self._connection, "_remote_is_local", False):
            return task_vars["ansible_playbook_python"], False
        value = self._templar.template(C.config.get_config_value("INTERPRETER_PYTHON", variables=task_vars))
        if value and value not in AUTO:
            return value, False
        known = (task_vars.get("ansible_facts") or {}).get(DISCOVERED)
        if known:
            return known, False
        found = discover_interpreter(action=self, interpreter_name="python", discovery_mode=value or "auto",
                                     task_vars=task_vars)
        delegated = self._task.delegate_to and not self._task.delegate_facts
        return found, not delegated
