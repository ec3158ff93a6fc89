#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: image_registry
short_description: Ask an OCI registry whether it answers, wants credentials, and holds an image's tag and labels
version_added: "0.5.0"
description:
  - Reads the registry's HTTP API (distribution spec v2) from the host it runs on - C(image.yml) before it builds, the
    kubernetes backend before it creates anything - with the credentials of the usual containers auth file, as
    podman, buildah and skopeo use them (Basic, or a Bearer token from the registry's token service).
  - The credentials go from the auth file into request headers only; they are never an argument, a result or a log
    line.
  - Changes nothing and never fails on what the registry says; RV(message) says what is wrong and the fix.
options:
  image:
    description: The image reference, V(registry.example.org:5000/multinode-deepspeed:3f2a9c0d1e4b5a67).
    type: str
    required: true
  auth_file:
    description:
      - The containers auth file. Unset - C(REGISTRY_AUTH_FILE), C(${XDG_RUNTIME_DIR}/containers/auth.json),
        C(~/.config/containers/auth.json), C(~/.docker/config.json), the first that names the registry.
    type: path
  insecure:
    description: Plain HTTP, or TLS without certificate checks (the registry's own choice; only where the user says so).
    type: bool
    default: false
  token_hosts:
    description:
      - Hosts other than the registry's own that its token service (the C(realm) of its 401 answer) may be on; the
        request for a token carries the auth file's credentials, so no other host is asked. Docker Hub's
        C(auth.docker.io) is known.
    type: list
    elements: str
    default: []
  labels:
    description: Read the image's labels too (its config blob).
    type: bool
    default: true
  timeout:
    description: Seconds per request.
    type: int
    default: 10
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Does the registry hold this stack's image?
  multinode.deepspeed.image_registry:
    image: "registry.example.org:5000/multinode-deepspeed:3f2a9c0d1e4b5a67"
  register: image_found
"""

RETURN = r"""
registry:
  description: The registry's host (and port).
  returned: always
  type: str
  sample: registry.example.org:5000
reachable:
  description: Its API answered.
  returned: always
  type: bool
credentials:
  description: The auth file had credentials for it (not the credentials).
  returned: always
  type: bool
exists:
  description: It holds the tag.
  returned: always
  type: bool
digest:
  description: The tag's manifest digest, or null.
  returned: always
  type: str
labels:
  description: The image's labels (empty when it does not exist).
  returned: always
  type: dict
  sample: {io.github.multinode.deepspeed.stack-fingerprint: 3f2a9c0d1e4b5a67}
error:
  description: Null, or V(reference), V(unreachable), V(credentials), V(error).
  returned: always
  type: str
message:
  description: What is wrong, naming the registry and the fix, or null.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import registry


def main():
    module = AnsibleModule(argument_spec=dict(image=dict(type="str", required=True),
                                              auth_file=dict(type="path"),
                                              insecure=dict(type="bool", default=False),
                                              token_hosts=dict(type="list", elements="str", default=[],
                                                               no_log=False),
                                              labels=dict(type="bool", default=True),
                                              timeout=dict(type="int", default=10)),
                           supports_check_mode=True)
    p = module.params
    result = registry.inspect(p["image"], auth_file=p["auth_file"], insecure=p["insecure"], labels=p["labels"],
                              timeout=p["timeout"], token_hosts=p["token_hosts"])
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
