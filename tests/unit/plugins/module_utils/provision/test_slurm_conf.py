"""module_utils/provision/slurm_conf.py: slurm.conf, gres.conf and slurmdbd.conf from the facts and the settings."""
import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import slurm_conf

SETTINGS = {"cluster_name": "multinode", "partition": "gpu", "partition_nodes": [], "slurmd_timeout": 60,
            "kill_wait": 10, "accounting": "slurmdbd", "proctrack": "proctrack/linuxproc", "task_plugin": "task/none",
            "select_parameters": "CR_Core_Memory", "extra": {}}
CONTROLLER = {"name": "coord", "hostname": "coord", "addr": "10.89.0.10"}


def hostvars(name, addr, cpus=2, mem=24000, gpus=0, **kw):
    hv = {"inventory_hostname": name, "ansible_host": addr, "multinode_accelerators": {"count": gpus},
          "ansible_facts": {"hostname": name, "processor_vcpus": cpus, "memtotal_mb": mem}}
    hv.update(kw)
    return hv


def nodes(*hvs):
    return slurm_conf.conf_nodes([slurm_conf.node_from_hostvars(h) for h in hvs])


def test_node_lines_come_from_the_facts():
    big = hostvars("gpu-a2", "10.0.0.2", cpus=96, mem=1031000, gpus=8, slurm_node_name="a2",
                   cluster_hosts_address="10.1.0.2")
    ns = nodes(hostvars("worker1", "10.89.0.11"), big)
    conf = slurm_conf.render_conf(SETTINGS, CONTROLLER, ns)
    assert "NodeName=worker1 NodeHostname=worker1 NodeAddr=10.89.0.11 CPUs=2 RealMemory=22528 State=UNKNOWN" in conf
    assert "NodeName=a2 NodeHostname=gpu-a2 NodeAddr=10.1.0.2 CPUs=96 RealMemory=978944 Gres=gpu:8 State=UNKNOWN" \
        in conf
    assert "GresTypes=gpu" in conf.splitlines()
    assert "PartitionName=gpu Nodes=worker1,a2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO" in conf
    assert "SlurmctldHost=coord(10.89.0.10)" in conf.splitlines()
    assert "AccountingStorageType=accounting_storage/slurmdbd" in conf.splitlines()
    gres = slurm_conf.render_gres(ns)
    assert "NodeName=a2 Name=gpu File=/dev/nvidia[0-7]" in gres and "worker1" not in gres


def test_cpu_only_cluster_has_no_gres_and_no_accounting_when_asked():
    conf = slurm_conf.render_conf(dict(SETTINGS, accounting="none"), CONTROLLER, nodes(hostvars("w1", "10.0.0.1")))
    assert "GresTypes" not in conf and "AccountingStorageType=accounting_storage/none" in conf


def test_batch_jobs_are_scheduled_without_slurms_three_second_delay():
    ns = nodes(hostvars("w1", "10.0.0.1"))
    # The role's default: a run's job that follows another job is not held up to 3 s.
    lines = slurm_conf.render_conf(dict(SETTINGS, batch_sched_delay=0), CONTROLLER, ns).splitlines()
    assert [x for x in lines if x.startswith("SchedulerParameters=")] == [
        "SchedulerParameters=bf_interval=1,batch_sched_delay=0"]
    # Unset (a caller of the filter that does not pass them): the same.
    assert "SchedulerParameters=bf_interval=1,batch_sched_delay=0" in slurm_conf.render_conf(
        SETTINGS, CONTROLLER, ns).splitlines()
    lines = slurm_conf.render_conf(dict(SETTINGS, backfill_interval="30"), CONTROLLER, ns).splitlines()
    assert "SchedulerParameters=bf_interval=30,batch_sched_delay=0" in lines
    # slurm_conf_extra's SchedulerParameters are kept, in one line, and its own batch_sched_delay wins.
    extra = {"SchedulerParameters": "defer,bf_interval=60", "MaxJobCount": 5000}
    conf = slurm_conf.render_conf(dict(SETTINGS, batch_sched_delay="2", extra=extra), CONTROLLER, ns)
    assert [x for x in conf.splitlines() if x.startswith("SchedulerParameters=")] == [
        "SchedulerParameters=defer,bf_interval=60,batch_sched_delay=2"]
    assert "MaxJobCount=5000" in conf.splitlines()
    conf = slurm_conf.render_conf(dict(SETTINGS, extra={"SchedulerParameters": "batch_sched_delay=5"}), CONTROLLER, ns)
    assert [x for x in conf.splitlines() if x.startswith("SchedulerParameters=")] == [
        "SchedulerParameters=batch_sched_delay=5,bf_interval=1"]


def test_slurmdbd_conf_has_no_password():
    dbd = slurm_conf.render_dbd("coord")
    assert "StorageUser=slurm" in dbd and "StorageHost=localhost" in dbd and "Pass" not in dbd


@pytest.mark.parametrize("change,needle", [
    ({"cluster_name": "Multi Node"}, "slurm_cluster_name='Multi Node'"),
    ({"partition": "default"}, "slurm_partition='default' is not a partition name"),
    ({"partition": "gpu;x"}, "slurm_partition='gpu;x'"),
    ({"partition_nodes": ["worker1", "worker9"]}, "slurm_partition_nodes lists worker9, which is not a worker"),
    ({"slurmd_timeout": "soon"}, "slurm_slurmd_timeout='soon' must be a whole number"),
    ({"accounting": "mysql"}, "slurm_accounting='mysql': slurmdbd or none"),
    ({"batch_sched_delay": "-1"}, "slurm_batch_sched_delay='-1' must be a whole number of seconds >= 0"),
    ({"batch_sched_delay": True}, "slurm_batch_sched_delay=True must be a whole number"),
    ({"backfill_interval": 0}, "slurm_backfill_interval=0 must be a whole number of seconds from 1 to 10800"),
    ({"backfill_interval": "10801"}, "slurm_backfill_interval='10801' must be a whole number of seconds from 1"),
    ({"backfill_interval": "1.5"}, "Fix: -e slurm_backfill_interval=1"),
])
def test_bad_settings_name_the_variable_and_the_fix(change, needle):
    ns = nodes(hostvars("worker1", "10.89.0.11"))
    problems = slurm_conf.conf_problems(dict(SETTINGS, **change), "coord", ns)
    assert any(needle in p and "Fix:" in p for p in problems), problems
    with pytest.raises(slurm_conf.SlurmError):
        slurm_conf.render_conf(dict(SETTINGS, **change), CONTROLLER, ns)


def test_the_coordinator_cannot_be_a_compute_node():
    problems = slurm_conf.conf_problems(SETTINGS, "coord", nodes(hostvars("coord", "10.89.0.10")))
    assert any("coord is both the Slurm controller" in p for p in problems)


def test_memory_in_whole_512_mb_steps_so_a_few_mb_less_after_a_reboot_changes_nothing():
    assert nodes(hostvars("w", "a", mem=24000))[0]["real_memory"] == nodes(hostvars("w", "a", mem=23990))[0][
        "real_memory"] == 22528
