# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    """A run collected to the controller, and the report and plots written into it (run_summary, bench_report)."""

    DOCUMENTATION = r"""
options:
  run_dir:
    description:
      - The run's directory collected to the controller - C(<collect_dir>/<run_id>), by default C(runs/<run_id>) in
        the directory C(ansible-playbook) runs from. The report and the plots are written into it.
    type: path
    required: true
  plots:
    description:
      - Draw the PNG plots (under C(plots/) in O(run_dir)) and show them in C(report.md).
      - Needs matplotlib in the Python that runs the module, the controller's (it is in C(requirements.txt)).
    type: bool
    default: true
requirements:
  - matplotlib (for O(plots))
notes:
  - Runs on the controller, with C(delegate_to=localhost), after the play collected the run.
  - Does not fail on a failed run - the playbook prints the outcome, checks C(summary.status) and fails the play
    itself; so the report is written for a failed run too.
"""
