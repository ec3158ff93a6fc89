# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    """How often an action plugin that waits on a job looks at it, and prints a line (watch, bench_watch)."""

    DOCUMENTATION = r"""
options:
  poll_interval:
    description: Seconds between two looks at the job.
    type: float
    default: 2
  progress_interval:
    description: Seconds between two progress lines (one more is printed when the job ends).
    type: float
    default: 10
"""
