# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    """The planned job a task acts on (run_prepare, preflight_cache)."""

    DOCUMENTATION = r"""
options:
  job:
    description:
      - The planned job - C(job) as M(multinode.deepspeed.job_plan) returns it (C(train_plan.job) in C(train.yml)).
    type: dict
    required: true
"""
