#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: image_base
short_description: The Debian root file system the stack's image starts from, as a tarball (debootstrap, cached)
version_added: "0.5.0"
description:
  - Runs C(debootstrap --variant=minbase) of the base's suite with its packages (Python, its venv module, a compiler
    for DeepSpeed's ops) from a Debian mirror - no image registry is needed for the base - then writes the tree as a
    tarball, as root (debootstrap needs it). No apt cache or lists, no machine id, and none of the build host's
    C(resolv.conf) or C(hostname) are kept.
  - Does nothing when the tarball exists (its name holds the suite, the mirror and the packages).
options:
  base:
    description: The C(base) of M(multinode.deepspeed.image_plan) (C(suite), C(mirror), C(packages), C(tarball)).
    type: dict
    required: true
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: The image's base
  multinode.deepspeed.image_base:
    base: "{{ image_decision.image.base }}"
"""

RETURN = r"""
tarball:
  description: The base's tarball.
  returned: always
  type: str
seconds:
  description: How long debootstrap and tar took (0 when it existed).
  returned: always
  type: float
"""

import os
import shutil
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import image as build


def main():
    module = AnsibleModule(argument_spec=dict(base=dict(type="dict", required=True)), supports_check_mode=True)
    base = module.params["base"]
    tarball = base["tarball"]
    if os.path.exists(tarball):
        module.exit_json(changed=False, tarball=tarball, seconds=0.0)
    if module.check_mode:
        module.exit_json(changed=True, tarball=tarball, seconds=0.0)
    if os.geteuid() != 0:
        module.fail_json(msg="debootstrap needs root on the build host (it makes device nodes and chroots). Fix: run "
                             "image.yml as root, or with --become")
    if not module.get_bin_path("debootstrap"):
        module.fail_json(msg="debootstrap is not on the build host. Fix: apt-get install debootstrap (scripts/setup "
                             "installs it on the controller)")
    os.makedirs(os.path.dirname(tarball), exist_ok=True)
    t0 = time.time()
    work = tempfile.mkdtemp(prefix="base-", dir=os.path.dirname(tarball))
    try:
        rootfs = os.path.join(work, "rootfs")
        rc, _out, err = module.run_command(build.base_argv(base, rootfs))
        if rc != 0:
            module.fail_json(msg="debootstrap %s from %s failed (exit %d): %s. Fix: check image_base_mirror" % (
                base["suite"], base["mirror"], rc, (err or "").strip()[-1500:]))
        for rel in build.BASE_REMOVE:
            path = os.path.join(rootfs, rel)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
                os.makedirs(path, exist_ok=True)
            elif os.path.lexists(path):
                os.unlink(path)
        # Written inside this build's own work directory, then renamed: two builds at once never write one file.
        part = os.path.join(work, "base.tar")
        rc, _out, err = module.run_command(["tar", "--numeric-owner", "-C", rootfs, "-cf", part, "."])
        if rc != 0:
            module.fail_json(msg="tar of the base failed: %s" % (err or "").strip()[-500:])
        os.chmod(part, 0o644)
        os.replace(part, tarball)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    module.exit_json(changed=True, tarball=tarball, seconds=round(time.time() - t0, 1))


if __name__ == "__main__":
    main()
