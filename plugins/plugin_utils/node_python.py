# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A function of the collection's module_utils, run on a node in a Python start of its own.

Ansible runs a module on a node through its module wrapper, whose import of ``ansible.module_utils.basic`` takes
about 0.1 s of the node's CPU (0.12 of the 0.14 s a read-only module takes there).  For a module whose work is
one function of pure module_utils, this runs the function itself: a script that holds the function's module and
every collection module it imports (as source text, found by their import lines), serves them to Python's import
system from memory, calls the function with the task's (checked) arguments and prints its result as JSON.  The
script goes to the node's Python on standard input, as a pipelined module does, so no argument is on a command
line and nothing is written on the node.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import importlib
import importlib.util
import json
import re

from ansible import constants as C
from ansible.executor.interpreter_discovery import discover_interpreter
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()

DISCOVERED = "discovered_interpreter_python"
AUTO = ("auto", "auto_legacy", "auto_silent", "auto_legacy_silent")
COLLECTION = "ansible_collections.multinode.deepspeed"
UTILS = COLLECTION + ".plugins.module_utils"
# "import M" or "from M import a, b" / "from M import (a,\n b)" of a collection module M; a name may be a module of
# package M.
_IMPORT_RE = re.compile(r"^(?:import\s+(%s(?:\.\w+)+)|from\s+(%s(?:\.\w+)+)\s+import\s+(\([^)]*\)|[^\n]*))"
                        % (re.escape(UTILS), re.escape(UTILS)), re.M)
_ANSIBLE_RE = re.compile(r"^(?:from|import)\s+ansible(?:\.|\s)", re.M)

# Serves SOURCES (module name -> source text) and PACKAGES to the import system, calls FUNCTION of MODULE with PARAMS
# and prints the result as JSON.
_BOOT = """import json
import os
import sys
from importlib.machinery import ModuleSpec

# As a module does (AnsibleModule): a working directory the user cannot read (become keeps the login's) is left for
# the home directory or /tmp.
try:
    if not os.access(os.getcwd(), os.F_OK | os.R_OK):
        raise OSError()
except OSError:
    for place in (os.path.expanduser("~"), "/tmp"):
        if os.access(place, os.F_OK | os.R_OK):
            os.chdir(place)
            break

SOURCES = %(sources)r
PACKAGES = %(packages)r


class Sources(object):
    def find_spec(self, name, path=None, target=None):
        if name in SOURCES or name in PACKAGES:
            return ModuleSpec(name, self, is_package=name in PACKAGES)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        if module.__name__ in PACKAGES:
            module.__path__ = []
        exec(compile(SOURCES.get(module.__name__, ""), module.__name__, "exec"), module.__dict__)


sys.meta_path.insert(0, Sources())
from %(module)s import %(function)s
sys.stdout.write(json.dumps(%(function)s(json.loads(%(params)r))))
"""


def _source(name):
    """The source text of collection module ``name`` (as the controller's collection loader finds it)."""
    module = importlib.import_module(name)
    with open(module.__file__) as fh:
        return fh.read()


def sources(name):
    """``{module name: source}`` of module ``name`` and every collection module it imports, recursively.

    Raises ValueError when one of them imports Ansible itself: that is not on the nodes."""
    found, todo = {}, [name]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        text = _source(current)
        if _ANSIBLE_RE.search(text):
            raise ValueError("%s imports Ansible, which a node does not have" % current)
        found[current] = text
        todo.extend(m for m in imported(text) if m not in found)
    return found


def imported(text):
    """The collection modules that source ``text`` imports: each ``import M`` and ``from M import ...``, and each
    name so imported from a package that is a module of it."""
    out = []
    for plain, origin, names in _IMPORT_RE.findall(text):
        out.append(plain or origin)
        if origin and _is_package(origin):
            for word in re.sub(r"#[^\n]*", "", names).strip("()").replace("\\", " ").split(","):
                word = word.split(" as ")[0].strip()
                if word and importlib.util.find_spec(origin + "." + word) is not None:
                    out.append(origin + "." + word)
    return out


def _is_package(name):
    try:
        spec = importlib.util.find_spec(name)
    except ImportError:
        return False
    return spec is not None and spec.submodule_search_locations is not None


def script(name, function, params):
    """The Python script that prints ``json.dumps(function(params))``, ``function`` from module ``name``."""
    found = sources(name)
    packages = sorted(set(".".join(m.split(".")[:i]) for m in found for i in range(1, m.count(".") + 1)))
    if not re.match(r"^[A-Za-z_]\w*$", function):
        raise ValueError("not a function name: %r" % function)
    return _BOOT % {"sources": found, "packages": packages, "module": name, "function": function,
                    "params": json.dumps(params)}


def direct_params(action, spec, read_only=False, args=None):
    """The task's arguments checked against the module's argument ``spec`` (its defaults filled in) when the
    function can run as the module would: pipelined, not ``async``, not in check mode unless it only reads
    (``read_only``), arguments the module takes as they are (no ``~`` or ``$`` in a path for the node to expand);
    else None (the module runs)."""
    task = action._task
    args = task.args if args is None else args
    if task.async_val or not action._is_pipelining_enabled("new") or (task.check_mode and not read_only):
        return None
    checked = ArgumentSpecValidator(spec).validate(args)
    paths = []
    for name, option in spec.items():
        value = args.get(name)
        if option.get("type") == "path" or option.get("elements") == "path":
            paths += value if isinstance(value, list) else [value]
    if checked.error_messages or any("~" in str(p) or "$" in str(p) for p in paths if p is not None):
        return None
    return checked.validated_parameters


def interpreter(action, task_vars):
    """``(the Python a module would run on, whether it was discovered now)``: ``ansible_python_interpreter`` (or
    the configuration's ``interpreter_python``), else the one discovered on the node before, else Ansible's
    interpreter discovery (whose answer the caller returns as a fact, as a module's result does)."""
    if getattr(action._connection, "_remote_is_local", False):
        return task_vars["ansible_playbook_python"], False
    value = action._templar.template(C.config.get_config_value("INTERPRETER_PYTHON", variables=task_vars))
    if value and value not in AUTO:
        return value, False
    known = (task_vars.get("ansible_facts") or {}).get(DISCOVERED)
    if known:
        return known, False
    found = discover_interpreter(action=action, interpreter_name="python", discovery_mode=value or "auto",
                                 task_vars=task_vars)
    return found, not (action._task.delegate_to and not action._task.delegate_facts)


def call(action, task_vars, spec, name, function, read_only=False, args=None):
    """What module ``function`` of collection module ``name`` returns on the action's node for the task's
    arguments (or ``args``; checked against the module's ``spec``), run there in a Python start of its own; None when it cannot
    run as the module would or gave no result (the caller then runs the module).  The node is reached as a
    pipelined module is (the action's connection and become, the task's environment); a connection failure raises
    as it would for the module."""
    params = direct_params(action, spec, read_only, args)
    if params is None:
        return None
    python, discovered = interpreter(action, task_vars)
    shell = action._connection._shell
    cmd = shell.build_module_command(action._compute_environment_string(), "#!" + python, "")
    res = action._low_level_execute_command(cmd, sudoable=True, in_data=script(name, function, params))
    try:
        data = json.loads(res.get("stdout") or "")
    except ValueError:
        data = None
    if res.get("rc") != 0 or not isinstance(data, dict):
        # Shown with -vvv: the module runs instead, and gives the result.
        display.vvv("%s.%s gave no result (rc %s: %s); running the module" % (
            name, function, res.get("rc"), " | ".join((res.get("stderr") or "").strip().splitlines()[-3:])),
            host=task_vars.get("inventory_hostname"))
        return None
    if discovered:
        data.setdefault("ansible_facts", {})[DISCOVERED] = python
    return data


class DirectAction(ActionBase):
    """The action plugin of a module whose work is ``FUNCTION`` of module_utils module ``NAME``: that function, run
    on the node by :func:`call`, else the module ``MODULE`` as the normal action runs it (``async`` included)."""
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = True
    MODULE = NAME = FUNCTION = SPEC = None
    # Whether the module only reads (check mode runs the function too).
    READ_ONLY = False

    def run(self, tmp=None, task_vars=None):
        result = super(DirectAction, self).run(tmp, task_vars)
        res = call(self, task_vars, self.SPEC, self.NAME, self.FUNCTION, read_only=self.READ_ONLY)
        if res is None:
            wrap_async = self._task.async_val and not self._connection.has_native_async
            res = self._execute_module(module_name=self.MODULE, module_args=self._task.args, task_vars=task_vars,
                                       wrap_async=wrap_async)
            if not wrap_async:
                self._remove_tmp_path(self._connection._shell.tmpdir)
        result.update(res)
        return result
