# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: rank_slots
short_description: Ranks per worker, from deepspeed_slots or the GPUs found
version_added: "0.1.0"
description:
  - For every host of the input list, the number of ranks it runs, that is its C(deepspeed_slots) host variable where
    the inventory sets one, otherwise its C(deepspeed_gpu_count) fact (one rank per GPU).
  - A host with neither (a CPU node without C(deepspeed_slots)) is left out, so a CPU node never becomes a
    rank by accident. The values are validated later by M(multinode.deepspeed.hostfile) (C(docs/train.md)).
positional: _input, hostvars
options:
  _input:
    description: Inventory names of the candidate hosts, in rank order.
    type: list
    elements: str
    required: true
  hostvars:
    description: The C(hostvars) of the play.
    type: dict
    required: true
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Slots of the workers
  ansible.builtin.debug:
    msg: "{{ groups['workers'] | multinode.deepspeed.rank_slots(hostvars) }}"
"""

RETURN = r"""
_value:
  description: Host name to slots, in the order of the input, for the hosts that run ranks.
  type: dict
"""

from ansible_collections.multinode.deepspeed.plugins.module_utils.common.hostfile import slots_from_vars


def rank_slots(hosts, hostvars):
    return slots_from_vars(hosts, lambda h: hostvars[h])


class FilterModule(object):
    def filters(self):
        return {"rank_slots": rank_slots}
