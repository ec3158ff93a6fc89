# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    """The directory of a running job, on the storage every node shares (run_status, watch)."""

    DOCUMENTATION = r"""
options:
  run_dir:
    description:
      - The run's directory on the storage every node shares, as the host the task runs on (normally the coordinator)
        sees it - C(<shared_dir>/runs/<run_id>), C(job.run_dir) of M(multinode.deepspeed.job_plan).
      - It holds the agents' heartbeats (C(nodes/<host>.json)), the ranks' metrics (C(metrics/rank*.jsonl)), their
        logs (C(logs/)) and the control files (C(control/lease), C(control/ABORT), C(control/DONE)); see
        C(docs/agents.md).
    type: path
    required: true
"""
