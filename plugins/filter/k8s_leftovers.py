# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: k8s_leftovers
short_description: The kubernetes backend's runs in a namespace that no controller follows any more
version_added: "0.9.0"
description:
  - From what M(kubernetes.core.k8s_info) read by the collection's labels, the run Services left by a controller
    that died (SIGKILL, a lost laptop) - past the run's deadline (its timeout and a minute, kept on the Service, so
    that a pod the scheduler never placed counts too), every pod ended two minutes ago and nothing collected it, or
    no pod two minutes after the Service was made.
  - Deleting such a Service deletes its pods and its Secret (it owns them). A live run, one whose controller is
    still collecting it, and O(keep) are never named.
  - The C(backend) role's C(kubernetes) start step uses it before it creates a run's objects (C(docs/kubernetes.md)).
positional: _input, pods, keep
options:
  _input:
    description: The registered result of C(kubernetes.core.k8s_info) for the namespace's Services with the
      collection's labels.
    type: dict
    required: true
  pods:
    description: The registered result of C(kubernetes.core.k8s_info) for the namespace's Pods with the collection's
      labels.
    type: dict
    required: true
  keep:
    description: Service names never named (the run about to start).
    type: list
    elements: str
    default: []
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Delete the runs a dead controller left in the namespace
  kubernetes.core.k8s:
    state: absent
    kind: Service
    namespace: train
    name: "{{ item.name }}"
  loop: "{{ services_info | multinode.deepspeed.k8s_leftovers(pods_info, [job_name]) }}"
"""

RETURN = r"""
_value:
  description: One entry per left-over run - C(name) (its Service) and C(reason).
  type: list
  elements: dict
"""

import time

from ansible.errors import AnsibleFilterError
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends.kubernetes.pods import leftovers


def k8s_leftovers(services, pods, keep=None):
    try:
        return leftovers((services or {}).get("resources") or [], (pods or {}).get("resources") or [],
                         time.time(), keep=list(keep or []))
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise AnsibleFilterError("k8s_leftovers: %s: %s" % (type(exc).__name__, exc))


class FilterModule(object):
    def filters(self):
        return {"k8s_leftovers": k8s_leftovers}
