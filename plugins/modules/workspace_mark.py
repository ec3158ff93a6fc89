#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: workspace_mark
short_description: Check a copied workdir against the plan's hash, then mark it whole
version_added: "0.6.0"
description:
  - Runs on the node that copied a user's workdir to the shared directory (C(train.yml) - the coordinator, as the
    run's account), right after the copy.
  - Hashes the tree at O(path) as M(multinode.deepspeed.job_plan) hashed the workdir on the controller (each file's
    path, the owner's execute bit, size and content; a symlink's target; not mtimes), with the same code
    (C(plugins/module_utils/plan/workdir.py)).
  - When the hashes match, makes the copy read-only (directories 0500, files 0400, or 0500 when the owner may execute
    them, so that the ranks, which run as its owner, cannot change it by accident), then writes O(marker) (the plan's
    C(workdir), as JSON, mode 0600, through a temporary file and a rename); a launch that finds the marker, and the
    copy still of the content it names, copies nothing. If the hashes differ, it fails naming the files missing there
    and the ones not planned (from O(files_from)), and writes no marker, so the next launch copies again.
options:
  path:
    description: The copy, C(<shared_dir>/workspaces/<id>).
    type: path
    required: true
  hash:
    description: The plan's hash of the workdir (sha256, hex).
    type: str
    required: true
  marker:
    description: The marker to write once the copy is whole, C(<shared_dir>/workspaces/<id>.json).
    type: path
    required: true
  content:
    description: What the marker holds (the plan's C(workdir)).
    type: dict
    default: {}
  files_from:
    description:
      - The plan's file list, as rsync read it (one C(./<path>) a line); only to name what differs.
    type: str
notes:
  - 'A copy that differs fails the task, for example V(the copy in /shared/workspaces/3f2a... is not the content the
    plan hashed (3f2a... planned, 9c41... there\): missing: #notes.py. Fix: launch again; ...).'
author:
  - multinode.deepspeed developers (@multinode)
extends_documentation_fragment:
  - multinode.deepspeed.attributes
attributes:
  check_mode:
    support: full
    description: Checks the copy and writes no marker.
"""

EXAMPLES = r"""
- name: Check the copy against the plan's hash, then mark it whole
  multinode.deepspeed.workspace_mark:
    path: "{{ train_job.workdir.dest }}"
    hash: "{{ train_job.workdir.hash }}"
    marker: "{{ train_job.workdir.marker }}"
    content: "{{ train_job.workdir }}"
    files_from: "{{ lookup('ansible.builtin.file', train_job.workdir.files_from_path, rstrip=false) }}"
"""

RETURN = r"""
count:
  description: The files and symlinks of the copy.
  returned: always
  type: int
  sample: 6
marker:
  description: The marker's path.
  returned: always
  type: str
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.multinode.deepspeed.plugins.module_utils.common import files
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan import workdir


def write_marker(path, content):
    """The marker, whole or not at all, readable by its owner only."""
    files.write_bytes(path, (json.dumps(content, indent=4, sort_keys=True) + "\n").encode("utf-8"), mode=0o600)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            hash=dict(type="str", required=True),
            marker=dict(type="path", required=True),
            content=dict(type="dict", default={}),
            files_from=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if not os.path.isdir(p["path"]):
        module.fail_json(msg="%s is not a directory: the workdir was not copied there. Fix: launch again (the copy "
                             "is redone)" % p["path"], marker=p["marker"], count=0)
    planned = workdir.planned_files(p["files_from"]) if p["files_from"] is not None else None
    problem = workdir.verify(p["path"], p["hash"], planned)
    count = len(workdir.tree(p["path"]))
    if problem:
        module.fail_json(msg="%s. Fix: launch again (no marker was written, so the copy is redone); a file that "
                             "changes while the play runs (a log, a checkpoint) belongs in workdir_exclude"
                             % problem, marker=p["marker"], count=count)
    if not module.check_mode:
        workdir.seal(p["path"])
        write_marker(p["marker"], p["content"])
    module.exit_json(changed=not module.check_mode, marker=p["marker"], count=count)


if __name__ == "__main__":
    main()
