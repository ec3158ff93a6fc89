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
import json
import re

COLLECTION = "ansible_collections.multinode.deepspeed"
UTILS = COLLECTION + ".plugins.module_utils"
_IMPORT_RE = re.compile(r"^(?:from|import)\s+(%s(?:\.\w+)+)" % re.escape(UTILS), re.M)
_ANSIBLE_RE = re.compile(r"^(?:from|import)\s+ansible(?:\.|\s)", re.M)

# Serves SOURCES (module name -> source text) and PACKAGES (empty packages) to the import system, calls FUNCTION of
# MODULE with PARAMS and prints the result as JSON.
_BOOT = """import json
import sys
from importlib.machinery import ModuleSpec

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
        todo.extend(m for m in _IMPORT_RE.findall(text) if m not in found)
    return found


def script(name, function, params):
    """The Python script that prints ``json.dumps(function(params))``, ``function`` from module ``name``."""
    found = sources(name)
    packages = sorted(set(".".join(m.split(".")[:i]) for m in found for i in range(1, m.count(".") + 1)))
    if not re.match(r"^[A-Za-z_]\w*$", function):
        raise ValueError("not a function name: %r" % function)
    return _BOOT % {"sources": found, "packages": packages, "module": name, "function": function,
                    "params": json.dumps(params)}
