# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: k8s_preflight
short_description: Preflight's verdicts on the Kubernetes cluster a kubernetes-backend job would run on
version_added: "0.6.0"
description:
  - From what kubernetes.core.k8s_info read on the controller, for the planned job - the API answers with the
    kubeconfig, the namespace exists, the schedulable and ready nodes have the allocatable GPUs
    (C(nvidia.com/gpu)) and, in the rdma fabric mode, the RDMA device resource for every pod, and the
    shared volume's claim exists and is bound.
  - Every failed verdict names what is missing and the fix.
  - The C(backend) role's C(kubernetes) entry point uses it (C(docs/kubernetes.md)).
positional: _input, extra, kubeconfig_found, namespace, nodes, claim, image, fingerprints
options:
  _input:
    description: The plan's backend options (C(job.backend_options)).
    type: dict
    required: true
  extra:
    description: The backend's C(job.launch.extra) (C(per_pod), C(pods)).
    type: dict
    required: true
  kubeconfig_found:
    description: Whether the kubeconfig exists on the controller.
    type: bool
    required: true
  namespace:
    description: The registered result of C(kubernetes.core.k8s_info) for the Namespace.
    type: dict
  nodes:
    description: The registered result of C(kubernetes.core.k8s_info) for every Node.
    type: dict
  claim:
    description: The registered result of C(kubernetes.core.k8s_info) for the PersistentVolumeClaim, when the
      shared volume is one.
    type: dict
  image:
    description:
      - The result of M(multinode.deepspeed.image_registry) for the job's image, skipped with
        C(k8s_image_check=false). The registry must hold the tag, and the stack its label names must be the rank
        nodes'.
    type: dict
  fingerprints:
    description: Rank node -> its stack fingerprint (the plan's C(stack_fingerprints)).
    type: dict
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Judge the cluster
  ansible.builtin.set_fact:
    verdicts: >-
      {{ job.backend_options | multinode.deepspeed.k8s_preflight(job.launch.extra, kubeconfig.stat.exists,
         namespace_info, nodes_info, claim_info) }}
"""

RETURN = r"""
_value:
  description: Verdicts (C(check), C(host) - always C(kubernetes), C(status), C(detail), C(fix)).
  type: list
  elements: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.kubernetes import preflight_verdicts


def k8s_preflight(opts, extra, kubeconfig_found, namespace=None, nodes=None, claim=None, image=None,
                  fingerprints=None):
    try:
        return preflight_verdicts(dict(opts or {}), dict(extra or {}), bool(kubeconfig_found), namespace, nodes,
                                  claim, image, fingerprints)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise AnsibleFilterError("k8s_preflight: %s: %s" % (type(exc).__name__, exc))


class FilterModule(object):
    def filters(self):
        return {"k8s_preflight": k8s_preflight}
