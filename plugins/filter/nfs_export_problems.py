# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: nfs_export_problems
short_description: Judge an NFS export's clients and options by what they mean
version_added: "0.3.0"
description:
  - Returns one sentence per problem, each with its fix; an empty list means the export is safe to write.
  - A client must be an IP address, a network no wider than a /16 (IPv4) or a /48 (IPv6), or a host name; wider
    networks (V(10.0.0.0/8), V(0.0.0.0/1)), wildcards (V(*), V(*.example.org)) and netgroups need I(allow_wide).
    Anything else (a space, parentheses that would smuggle options into the exports file) is refused.
  - Export options V(no_root_squash), V(insecure), V(async), V(no_auth_nlm), V(insecure_locks) and V(anonuid=0) /
    V(anongid=0) are refused however they are spelled; V(sync) and V(root_squash) (or V(all_squash)) are required.
  - Mount options need V(hard) (never V(soft)) and V(_netdev); the export's owner must not be root.
  - The C(nfs) role runs it before it changes anything (C(docs/roles/nfs.md)).
options:
  _input:
    description: Keys C(clients), C(options), C(mount_options) (lists), C(owner) and C(allow_wide).
    type: dict
    required: true
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Refuse an export that is not safe
  ansible.builtin.fail:
    msg: "{{ problems | join(' ') }}"
  vars:
    problems: >-
      {{ {'clients': ['10.0.0.0/24'], 'options': ['rw', 'sync', 'root_squash'], 'mount_options': ['hard', '_netdev'],
          'owner': 'deepspeed'} | multinode.deepspeed.nfs_export_problems }}
  when: problems | length > 0
"""

RETURN = r"""
_value:
  description: The problems, one sentence each with its fix; empty when the export is safe.
  type: list
  elements: str
"""

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.nfs import export_problems


def nfs_export_problems(settings):
    return export_problems(settings or {})


class FilterModule(object):
    def filters(self):
        return {"nfs_export_problems": nfs_export_problems}
