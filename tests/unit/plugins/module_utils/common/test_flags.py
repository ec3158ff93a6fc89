"""An inventory or -e boolean as Ansible reads it (common/flags.py)."""
import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.common.flags import flag


@pytest.mark.parametrize("value", ["false", " No ", "off", "n", "F", "0", "0.0", "", 0, False, None])
def test_what_ansible_reads_as_false_is_false(value):
    assert flag(value) is False


@pytest.mark.parametrize("value", ["true", "yes", "on", "1", "anything", 1, True])
def test_everything_else_is_true(value):
    assert flag(value) is True
