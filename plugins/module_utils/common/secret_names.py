# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which variables hold secrets, by their names, and an environment with their values masked.

The plan refuses a secret-named variable in ``deepspeed_rank_env`` (the way for a secret is ``secret_env``) and finds
the secret keys of the user's DeepSpeed config; what a run reports shows the ranks' environment with those values
masked: one list of words for all of them.

Pure Python, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "API_KEY", "ACCESS_KEY", "PRIVATE_KEY")


def secret_name(key):
    """Does the variable's name say it holds a secret (a path to one, ``*_PATH``/``*_FILE``, does not)?"""
    upper = str(key).upper()
    return any(w in upper for w in SECRET_WORDS) and not upper.endswith(("_PATH", "_FILE"))


def mask_env(env):
    """The environment with the values of secret-looking variables replaced (paths to secrets are kept)."""
    return dict((key, "********" if secret_name(key) else value) for key, value in env.items())
