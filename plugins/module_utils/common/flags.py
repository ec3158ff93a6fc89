# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""An inventory or -e boolean as Ansible reads it: what the plan, the launch backends' options and preflight's
settings take as on or off.

Pure Python, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


def flag(value):
    """An inventory or -e boolean as Ansible reads it (its BOOLEANS_FALSE): false, no, off, n, f, 0 are false."""
    if isinstance(value, str):
        return value.strip().lower() not in ("false", "no", "off", "n", "f", "0", "0.0", "")
    return bool(value)
