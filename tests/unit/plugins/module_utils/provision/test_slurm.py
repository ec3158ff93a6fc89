"""module_utils/provision/slurm.py: slurm.conf from the facts, sinfo read back, the partition and preflight verdicts."""
from pathlib import Path

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import slurm

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures" / "slurm"
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
    return slurm.conf_nodes([slurm.node_from_hostvars(h) for h in hvs])


def test_node_lines_come_from_the_facts():
    big = hostvars("gpu-a2", "10.0.0.2", cpus=96, mem=1031000, gpus=8, slurm_node_name="a2",
                   cluster_hosts_address="10.1.0.2")
    ns = nodes(hostvars("worker1", "10.89.0.11"), big)
    conf = slurm.render_conf(SETTINGS, CONTROLLER, ns)
    assert "NodeName=worker1 NodeHostname=worker1 NodeAddr=10.89.0.11 CPUs=2 RealMemory=22528 State=UNKNOWN" in conf
    assert "NodeName=a2 NodeHostname=gpu-a2 NodeAddr=10.1.0.2 CPUs=96 RealMemory=978944 Gres=gpu:8 State=UNKNOWN" \
        in conf
    assert "GresTypes=gpu" in conf.splitlines()
    assert "PartitionName=gpu Nodes=worker1,a2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO" in conf
    assert "SlurmctldHost=coord(10.89.0.10)" in conf.splitlines()
    assert "AccountingStorageType=accounting_storage/slurmdbd" in conf.splitlines()
    gres = slurm.render_gres(ns)
    assert "NodeName=a2 Name=gpu File=/dev/nvidia[0-7]" in gres and "worker1" not in gres


def test_cpu_only_cluster_has_no_gres_and_no_accounting_when_asked():
    conf = slurm.render_conf(dict(SETTINGS, accounting="none"), CONTROLLER, nodes(hostvars("w1", "10.0.0.1")))
    assert "GresTypes" not in conf and "AccountingStorageType=accounting_storage/none" in conf


def test_batch_jobs_are_scheduled_without_slurms_three_second_delay():
    ns = nodes(hostvars("w1", "10.0.0.1"))
    # The role's default: a run's job that follows another job is not held up to 3 s.
    lines = slurm.render_conf(dict(SETTINGS, batch_sched_delay=0), CONTROLLER, ns).splitlines()
    assert [x for x in lines if x.startswith("SchedulerParameters=")] == [
        "SchedulerParameters=bf_interval=1,batch_sched_delay=0"]
    # Unset (a caller of the filter that does not pass them): the same.
    assert "SchedulerParameters=bf_interval=1,batch_sched_delay=0" in slurm.render_conf(
        SETTINGS, CONTROLLER, ns).splitlines()
    lines = slurm.render_conf(dict(SETTINGS, backfill_interval="30"), CONTROLLER, ns).splitlines()
    assert "SchedulerParameters=bf_interval=30,batch_sched_delay=0" in lines
    # slurm_conf_extra's SchedulerParameters are kept, in one line, and its own batch_sched_delay wins.
    conf = slurm.render_conf(dict(SETTINGS, batch_sched_delay="2", extra={"SchedulerParameters": "defer,bf_interval=60",
                                                                          "MaxJobCount": 5000}), CONTROLLER, ns)
    assert [x for x in conf.splitlines() if x.startswith("SchedulerParameters=")] == [
        "SchedulerParameters=defer,bf_interval=60,batch_sched_delay=2"]
    assert "MaxJobCount=5000" in conf.splitlines()
    conf = slurm.render_conf(dict(SETTINGS, extra={"SchedulerParameters": "batch_sched_delay=5"}), CONTROLLER, ns)
    assert [x for x in conf.splitlines() if x.startswith("SchedulerParameters=")] == [
        "SchedulerParameters=batch_sched_delay=5,bf_interval=1"]


def test_slurmdbd_conf_has_no_password():
    dbd = slurm.render_dbd("coord")
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
    problems = slurm.conf_problems(dict(SETTINGS, **change), "coord", ns)
    assert any(needle in p and "Fix:" in p for p in problems), problems
    with pytest.raises(slurm.SlurmError):
        slurm.render_conf(dict(SETTINGS, **change), CONTROLLER, ns)


def test_the_coordinator_cannot_be_a_compute_node():
    problems = slurm.conf_problems(SETTINGS, "coord", nodes(hostvars("coord", "10.89.0.10")))
    assert any("coord is both the Slurm controller" in p for p in problems)


def test_memory_in_whole_512_mb_steps_so_a_few_mb_less_after_a_reboot_changes_nothing():
    assert nodes(hostvars("w", "a", mem=24000))[0]["real_memory"] == nodes(hostvars("w", "a", mem=23990))[0][
        "real_memory"] == 22528


def test_an_idle_node_that_does_not_answer_fails():
    rows = slurm.parse_sinfo("worker1|gpu*|idle*|none\n")
    (v,) = slurm.partition_verdicts(rows, "gpu", ["worker1"], "coord")
    assert v["status"] == "fail" and v["detail"] == "worker1 is idle* in Slurm"


def test_sinfo_read_back():
    rows = slurm.parse_sinfo((FIXTURES / "sinfo-idle.txt").read_text())
    assert rows == [{"node": "worker1", "partition": "gpu", "default": True, "state": "idle", "raw_state": "idle",
                     "reason": ""},
                    {"node": "worker2", "partition": "gpu", "default": True, "state": "idle", "raw_state": "idle",
                     "reason": ""}]


def test_partition_verdicts_per_node_state():
    rows = slurm.parse_sinfo((FIXTURES / "sinfo-mixed.txt").read_text())
    got = dict((v["host"], v) for v in slurm.partition_verdicts(
        rows, "gpu", ["worker1", "worker2", "worker3", "worker4", "worker5", "worker6"], "coord"))
    assert got["worker1"]["status"] == "pass"
    assert got["worker2"]["status"] == "fail" and got["worker2"]["detail"] == \
        "worker2 is down* in Slurm (Not responding)"
    assert "scontrol update nodename=worker2 state=resume" in got["worker2"]["fix"]
    assert got["worker3"]["status"] == "fail" and "e2e-maintenance" in got["worker3"]["detail"]
    assert got["worker4"]["status"] == "warn" and "squeue -w worker4" in got["worker4"]["fix"]
    assert got["worker5"]["detail"] == "worker5 is not in partition gpu (it is in debug)"
    assert got["worker6"]["detail"].endswith("nor in any partition: slurm.conf does not define it")
    assert "-e exclude=worker6" in got["worker6"]["fix"]


def test_an_unknown_partition_lists_the_known_ones():
    rows = slurm.parse_sinfo((FIXTURES / "sinfo-mixed.txt").read_text())
    (v,) = slurm.partition_verdicts(rows, "a100", ["worker1"], "coord")
    assert v["status"] == "fail" and v["detail"] == "partition a100 does not exist (sinfo shows debug, gpu)"
    assert v["fix"] == "-e slurm_partition=<one of debug, gpu>"


def test_no_slurm_at_all():
    (v,) = slurm.partition_verdicts([], "gpu", ["worker1"], "coord")
    assert v["status"] == "fail" and "sinfo lists no nodes" in v["detail"]


def test_preflight_munge_and_versions():
    verdicts = slurm.preflight_verdicts(
        "coord",
        {"coord": {"rc": 0}, "worker1": {"rc": 0},
         "worker2": {"rc": 15, "stderr": "unmunge: Error: Invalid credential\n"},
         "worker3": {"rc": 15, "stderr": "unmunge: Error: Expired credential"},
         "worker4": {"rc": 1, "stderr": "unmunge: Error: Failed to access /run/munge/munge.socket.2: "
                                        "No such file or directory"}},
        {"coord": "slurm-wlm 22.05.8", "worker1": "slurm-wlm 22.05.8", "worker2": "slurm 23.02.1",
         "worker3": None})
    got = dict(((v["check"], v["host"]), v) for v in verdicts)
    assert got[("slurm munge", "worker1")]["status"] == "pass"
    assert got[("slurm munge", "worker2")]["detail"] == \
        "cannot decode coord's munge credential: unmunge: Error: Invalid credential"
    assert "copy coord's /etc/munge/munge.key to worker2" in got[("slurm munge", "worker2")]["fix"]
    assert "synchronize the clocks" in got[("slurm munge", "worker3")]["fix"]
    assert got[("slurm munge", "worker4")]["fix"] == "start munged on worker4 (service munge start)"
    assert got[("slurm version", "worker1")]["status"] == "pass"
    assert got[("slurm version", "worker2")]["detail"] == "runs Slurm 23.02.1 but coord runs 22.05.8"
    assert got[("slurm version", "worker3")]["status"] == "fail"
