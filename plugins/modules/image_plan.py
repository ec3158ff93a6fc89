#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: image_plan
short_description: Decide the stack's image before anything is built - the accelerator, the matched stack, the base
version_added: "0.5.0"
description:
  - Chooses the stack for the image with the same compatibility matrix and pins as C(site.yml) (the collection's
    C(select_stack)) for the image's accelerator - O(accelerator), else what the workers' facts say - and, for a CUDA
    image, O(cuda) or the highest CUDA every GPU worker's driver runs.
  - 'Fails before anything is built, with one line per problem naming the variable and the fix: an accelerator the
    matrix has no stack for, a CUDA it has no build for, a registry or name that is not one, a base whose Python is
    not the one the controller builds wheels with.'
  - Changes nothing; role C(image) runs it on the build host.
options:
  accelerator:
    description: V(cuda) or V(cpu); empty - from O(workers).
    type: str
    default: ""
  cuda:
    description: The CUDA of a CUDA image (V(13.0)); empty - the workers' drivers decide, or the newest build.
    type: str
    default: ""
  workers:
    description: Worker -> its M(multinode.deepspeed.accelerator_facts) (C(status), C(cuda_driver_version)).
    type: dict
    default: {}
  registry:
    description: The registry (host or host:port) the image is pushed to; empty with O(push=false).
    type: str
    default: ""
  name:
    description: The image's name in the registry.
    type: str
    default: multinode-deepspeed
  push:
    description: Whether the image goes to O(registry).
    type: bool
    default: true
  suite:
    description: The Debian suite of the base.
    type: str
    default: bookworm
  mirror:
    description: The Debian mirror debootstrap reads; empty - the build host's own apt mirror.
    type: str
    default: ""
  torch:
    description: The torch pin (role C(stack)'s C(stack_torch_version)).
    type: str
    default: ""
  deepspeed:
    description: The DeepSpeed pin (C(stack_deepspeed_version)).
    type: str
    default: ""
  matrix_extra:
    description: C(stack_matrix_extra).
    type: dict
    default: {}
  extra_packages:
    description: C(stack_extra_packages).
    type: list
    elements: str
    default: []
  venv:
    description: Where the venv is, in the image (the plan's venv, C(stack_venv_dir)).
    type: str
    required: true
  home:
    description: C(stack_home) (the node package under C(lib/), the ops under C(torch_extensions/)).
    type: str
    required: true
  build_ops:
    description: Prebuild DeepSpeed's ops in the image (C(stack_build_ops)).
    type: bool
    default: true
  ops:
    description: Accelerator -> op builders (C(stack_ops)).
    type: dict
    default: {}
  cache_dir:
    description: The build host's cache (the base tarball, the build context).
    type: path
    required: true
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Decide the CPU image
  multinode.deepspeed.image_plan:
    accelerator: cpu
    registry: "127.0.0.1:5000"
    mirror: http://deb.debian.org/debian
    venv: /opt/multinode-deepspeed/venv
    home: /opt/multinode-deepspeed
    cache_dir: ~/.cache/multinode-deepspeed/images
  register: image_decision
"""

RETURN = r"""
image:
  description:
    - Keys C(accelerator), C(accelerator_from), C(build) (V(cpu), V(cu130)), C(packages), C(torch), C(deepspeed),
      C(cuda), C(cuda_toolkit), C(index_url), C(python), C(repository) (registry/name, no tag), C(registry), C(base)
      (C(suite), C(mirror), C(packages), C(tarball), C(key)), C(context), C(ops), C(venv), C(home).
  returned: success
  type: dict
"""

import sys

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import image as build


def main():
    spec = dict(accelerator=dict(type="str", default=""), cuda=dict(type="str", default=""),
                workers=dict(type="dict", default={}), registry=dict(type="str", default=""),
                name=dict(type="str", default="multinode-deepspeed"), push=dict(type="bool", default=True),
                suite=dict(type="str", default="bookworm"), mirror=dict(type="str", default=""),
                torch=dict(type="str", default=""), deepspeed=dict(type="str", default=""),
                matrix_extra=dict(type="dict", default={}),
                extra_packages=dict(type="list", elements="str", default=[]),
                venv=dict(type="str", required=True), home=dict(type="str", required=True),
                build_ops=dict(type="bool", default=True), ops=dict(type="dict", default={}),
                cache_dir=dict(type="path", required=True))
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    p = module.params
    python = "%d.%d" % sys.version_info[:2]
    p["mirror"] = p["mirror"] or build.apt_mirror()
    try:
        decision = build.plan(p, p["workers"], python)
    except build.ImageError as exc:
        module.fail_json(msg="image.yml cannot build this image (nothing was built):\n%s" % exc)
    module.exit_json(changed=False, image=decision)


if __name__ == "__main__":
    main()
