# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    """The attributes the modules share.

    Every module with attributes extends ``multinode.deepspeed.attributes`` (no module shows a diff), and at most one
    of the variants below for its check mode; what a module says in its own ``attributes:`` wins over the fragments
    (its own check mode, a diff wording of its own, the fact it returns).
    """

    # Every module: none shows a diff.
    DOCUMENTATION = r"""
attributes:
  diff_mode:
    support: none
    description: Shows no diff.
"""

    # A module that only reads (node_facts, node_probe, preflight_cache).
    READ_ONLY = r"""
attributes:
  check_mode:
    support: full
    description: Reads only.
"""

    # A facts module (accelerator_facts, fabric_facts); the module's own C(facts) description names the fact.
    FACTS = r"""
attributes:
  check_mode:
    support: full
    description: Only reads; runs the same in check mode.
  facts:
    support: full
"""

    # A module that writes its result (hostfile, run_summary): check mode computes it and writes nothing.
    DRY_RUN = r"""
attributes:
  check_mode:
    support: full
    description: Computes the result and reports C(changed) without writing anything.
"""
