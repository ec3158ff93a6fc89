#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: image_context
short_description: The stack image's tag (the stack fingerprint) and, when it must be built, its build context
version_added: "0.5.0"
description:
  - Predicts the venv the image will hold - the base's Python and the wheels its C(python3 -m venv) starts with
    (read from the base's tarball), then what C(pip install --dry-run --report) of the stack's packages from the
    wheelhouse installs into a throwaway venv holding those same wheels - and returns its fingerprint, the one M(multinode.deepspeed.node_facts) reads on a node
    that C(site.yml) provisioned with the same stack. That fingerprint is the image's tag.
  - With O(write=true), writes the build context - the base tarball, the wheels (hard links), the node package and
    the Containerfile; nothing secret is ever in it.
options:
  image:
    description: The C(image) of M(multinode.deepspeed.image_plan).
    type: dict
    required: true
  wheels:
    description: The wheel set's directory on the build host (the wheelhouse's build).
    type: path
    required: true
  trainer_src:
    description: The collection's C(multinode_ds) directory.
    type: path
    required: true
  module_utils_src:
    description: The collection's C(plugins/module_utils) directory (the node package's copied parts).
    type: path
    required: true
  write:
    description: Write the build context too.
    type: bool
    default: false
  tag:
    description:
      - The tag an earlier call predicted (RV(tag)); given, it is used as is and nothing is predicted again
        (RV(python) is null and RV(dist_info) empty).
    type: str
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: The image's tag
  multinode.deepspeed.image_context:
    image: "{{ image_decision.image }}"
    wheels: ~/.cache/multinode-deepspeed/wheelhouse/cpu
    trainer_src: "{{ playbook_dir }}/../multinode_ds"
    module_utils_src: "{{ playbook_dir }}/../plugins/module_utils"
  register: image_tag
"""

RETURN = r"""
tag:
  description: The stack's fingerprint; null in check mode before the base or the wheelhouse exists.
  returned: always
  type: str
  sample: 3f2a9c0d1e4b5a67
ref:
  description: The image reference, repository and tag.
  returned: always
  type: str
python:
  description: The base's Python version (the venv's); null when O(tag) is given.
  returned: always
  type: str
dist_info:
  description: The dist-info names the venv will hold.
  returned: always
  type: list
  elements: str
labels:
  description: The image's labels.
  returned: always
  type: dict
context:
  description: >-
    The build context's directory (with O(write=true)): a new one beside the planned path, so that two builds at
    once never share one; the caller removes it. In check mode, the planned path (nothing is written).
  returned: when write
  type: str
containerfile:
  description: The Containerfile's path in the context (with O(write=true); in check mode it is not written).
  returned: when write
  type: str
"""

import json
import os
import shutil
import sys
import tarfile
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import image as build
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import node


def predict(module, image, wheels):
    """The base's Python and the dist-info names of the venv the build makes: a throwaway venv seeded with the
    base's own ensurepip wheels, then pip's dry run of the stack's packages from the wheelhouse, which lists what it
    would install or upgrade (a seed that satisfies every requirement stays, as in the build)."""
    python, seeds, members = build.base_python(image["base"]["tarball"])
    if not python:
        module.fail_json(msg="the base %s has no installed Python interpreter package. Fix: remove it (image.yml "
                             "makes it again)" % image["base"]["tarball"])
    tmp = tempfile.mkdtemp(prefix="image-resolve-")
    try:
        pip = seeded_venv(module, image["base"]["tarball"], members, tmp)
        report_path = os.path.join(tmp, "report.json")
        argv = pip + ["--isolated", "install", "--dry-run", "--quiet", "--disable-pip-version-check", "--no-index",
                      "--only-binary", ":all:", "--find-links", wheels, "--report", report_path]
        rc, _out, err = module.run_command(argv + list(image["packages"]))
        if rc != 0:
            module.fail_json(msg="pip cannot resolve the stack's packages from the wheelhouse %s: %s. Fix: run "
                                 "image.yml again (it builds the wheelhouse), or site.yml" % (
                                     wheels, (err or "").strip()[-1500:]))
        with open(report_path) as fh:
            report = json.load(fh)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return python, build.predicted_names(seeds, report, {})


def seeded_venv(module, tarball, members, tmp):
    """A venv (the controller's Python, the same minor as the base's) holding the base's pip and setuptools wheels;
    returns the argv of its pip."""
    seeds = os.path.join(tmp, "seeds")
    os.makedirs(seeds)
    with tarfile.open(tarball) as tf:
        for wheel, member in members.items():
            with open(os.path.join(seeds, wheel), "wb") as out:
                shutil.copyfileobj(tf.extractfile(member), out)
    venv = os.path.join(tmp, "venv")
    for argv in ([sys.executable, "-m", "venv", "--without-pip", venv],
                 [os.path.join(venv, "bin", "python"), os.path.join(seeds, _pip_wheel(module, members), "pip"),
                  "--isolated", "install", "--quiet", "--disable-pip-version-check", "--no-index", "--find-links",
                  seeds] + [w.split("-", 1)[0] for w in sorted(members)]):
        rc, _out, err = module.run_command(argv)
        if rc != 0:
            module.fail_json(msg="the venv that predicts the image's cannot be made (%s): %s" % (
                " ".join(argv[:3]), (err or "").strip()[-1000:]))
    return [os.path.join(venv, "bin", "python"), "-m", "pip"]


def _pip_wheel(module, members):
    found = [w for w in members if w.startswith("pip-")]
    if not found:
        module.fail_json(msg="the base has no pip wheel for its venvs (/usr/share/python-wheels). Fix: remove the "
                             "base tarball; image.yml makes it again with python3-venv")
    return found[0]


def write_context(image, wheels, trainer_src, utils_src, text):
    """The build context, in a new directory of its own beside the planned path (two builds at once never share
    one): base.tar and the wheels as hard links, the node package, the Containerfile.  Returns its path."""
    os.makedirs(os.path.dirname(image["context"]), exist_ok=True)
    ctx = tempfile.mkdtemp(prefix=os.path.basename(image["context"]) + "-", dir=os.path.dirname(image["context"]))
    os.chmod(ctx, 0o755)
    os.makedirs(os.path.join(ctx, "wheels"))
    for name in sorted(os.listdir(wheels)):
        if name.endswith(".whl"):
            _link(os.path.join(wheels, name), os.path.join(ctx, "wheels", name))
    _link(image["base"]["tarball"], os.path.join(ctx, "base.tar"))
    shutil.copytree(trainer_src, os.path.join(ctx, "multinode_ds"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for dest, src in build.NODE_EXTRA.items():
        shutil.copyfile(os.path.join(utils_src, src), os.path.join(ctx, "multinode_ds", dest))
    with open(os.path.join(ctx, "Containerfile"), "w") as fh:
        fh.write(text)
    return ctx


def _link(src, dest):
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def main():
    module = AnsibleModule(argument_spec=dict(image=dict(type="dict", required=True),
                                              wheels=dict(type="path", required=True),
                                              trainer_src=dict(type="path", required=True),
                                              module_utils_src=dict(type="path", required=True),
                                              write=dict(type="bool", default=False),
                                              tag=dict(type="str")),
                           supports_check_mode=True)
    p = module.params
    image = p["image"]
    with open(os.path.join(p["trainer_src"], "__init__.py")) as fh:
        match = node.VERSION_RE.search(fh.read())
    trainer = match.group(1) if match else None
    if module.check_mode and not (os.path.exists(image["base"]["tarball"]) and os.path.isdir(p["wheels"])):
        # Check mode on a host without the base or the wheels: they are not made, so the tag cannot be known.
        module.exit_json(changed=True, tag=None, ref=None, python=None, dist_info=[], labels={},
                         msg="check mode: the base or the wheelhouse is not there yet, so the tag is unknown")
    if p["tag"]:
        # The tag an earlier call of this play predicted: not predicted again.
        python, names, tag = None, [], p["tag"]
    else:
        python, names = predict(module, image, p["wheels"])
        tag = build.fingerprint(python, names, trainer)
    result = {"changed": False, "tag": tag, "ref": "%s:%s" % (image["repository"], tag), "python": python,
              "dist_info": names, "labels": build.labels(image, tag, trainer)}
    if p["write"]:
        try:
            text = build.containerfile(image, tag, trainer)
        except build.ImageError as exc:
            module.fail_json(msg=str(exc), **result)
        result["changed"] = True
        result["context"] = image["context"]
        if not module.check_mode:
            result["context"] = write_context(image, p["wheels"], p["trainer_src"], p["module_utils_src"], text)
        result["containerfile"] = os.path.join(result["context"], "Containerfile")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
