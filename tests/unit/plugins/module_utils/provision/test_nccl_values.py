"""nccl_env and nccl_socket_ifname reach every launch's .deepspeed_env and DeepSpeed's remote shell command: a
value a shell would expand is refused at the source, naming the host, the variable and the fix."""
import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.nccl import (
    NcclError, check_settings, node_profile)

from tests.unit.plugins.module_utils.sysfs_facts import facts


@pytest.mark.parametrize("value", ["/tmp/x$(touch /tmp/p)", "a`id`", "x;reboot", "a b", "x\ny", "'q'", '"q"',
                                   "x&&y", "a|b", "${HOME}", "~root/x", "a>b"])
def test_a_value_a_shell_would_expand_is_refused_naming_host_variable_and_fix(value):
    with pytest.raises(NcclError) as err:
        node_profile(facts("roce"), host="w1", env={"NCCL_DEBUG_FILE": value})
    msg = str(err.value)
    assert msg.startswith("host w1:") and "nccl_env: NCCL_DEBUG_FILE=" in msg and "deepspeed_rank_env" in msg


@pytest.mark.parametrize("env", [{"NCCL_DEBUG": "INFO"}, {"NCCL_DEBUG_FILE": "/tmp/nccl.%h.%p"},
                                 {"NCCL_SOCKET_IFNAME": "^docker,lo"}, {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1"},
                                 {"NCCL_IB_GID_INDEX": 3}, {"NCCL_ALGO": ""}, {"NCCL_ALGO": None}])
def test_the_values_nccl_takes_pass(env):
    check_settings("w1", None, env)
    node_profile(facts("roce"), host="w1", env=env)


@pytest.mark.parametrize("key", ["1X", "A-B", "A B", "X=Y", ""])
def test_a_key_that_is_not_a_variable_name_is_refused(key):
    with pytest.raises(NcclError, match=r"host w2: .*nccl_env: .* is not a variable name"):
        check_settings("w2", None, {key: "1"})


@pytest.mark.parametrize("ifname", ["eth0$(id)", "eth0 eth1", "a;b", "averyveryverylongname0", "=", ""])
def test_a_socket_interface_that_is_not_one_is_refused(ifname):
    if ifname == "":
        check_settings("w1", ifname, {})  # empty: the interface carrying the node's address
        return
    with pytest.raises(NcclError, match=r"host w1: nccl_socket_ifname=.* is not a network interface name"):
        node_profile(facts("roce"), host="w1", socket_ifname=ifname)


@pytest.mark.parametrize("ifname", ["eth0", "=eth0", "^docker,lo", "ib0:1", "enp1s0f0np0", "bond0.100"])
def test_interface_names_and_nccl_forms_pass(ifname):
    check_settings("w1", ifname, None)


def test_every_problem_in_one_message():
    with pytest.raises(NcclError) as err:
        check_settings("w3", "a b", {"X": "$(id)", "1": "2"})
    assert str(err.value).count("Fix:") == 3


def test_nccl_env_that_is_not_a_mapping_is_refused():
    with pytest.raises(NcclError, match="nccl_env must be a mapping"):
        check_settings("w1", None, ["NCCL_DEBUG=INFO"])
