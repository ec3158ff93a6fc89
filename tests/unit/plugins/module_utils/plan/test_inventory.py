"""module_utils/plan/inventory.py: the inventory's shape, every problem at once with its fix."""
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.inventory import inventory_problems

GROUPS = {"coordinator": ["coord"], "workers": ["worker1", "worker2"], "spares": ["worker3"]}


def hostvars(**per_host):
    return dict((h, dict(per_host.get(h, {}))) for h in ("coord", "worker1", "worker2", "worker3", "nfs9"))


def test_a_good_inventory_has_no_problem():
    assert inventory_problems(GROUPS, hostvars()) == []
    nfs = dict((h, {"shared_dir_provider": "nfs"}) for h in ("coord", "worker1", "worker2", "worker3"))
    assert inventory_problems(GROUPS, hostvars(**nfs)) == []
    assert inventory_problems({"coordinator": ["coord"], "workers": ["worker1"]}, hostvars()) == []


def test_the_groups():
    problems = inventory_problems({"coordinator": ["coord", "worker1"], "workers": ["worker1"],
                                   "spares": ["worker1"]}, hostvars())
    assert problems == [
        "The inventory's coordinator group has 2 hosts (coord, worker1); it needs exactly one. Fix: put the node that "
        "launches runs (a CPU machine is fine) in the group 'coordinator'.",
        "worker1 is in both the coordinator and the workers group. Fix: keep the coordinator out of 'workers'; it "
        "launches runs and is never a rank.",
        "worker1 is in the spares group and in the coordinator or workers group. Fix: a spare is a node of its own "
        "that takes a failed worker's place (-e restarts=N); keep it only in 'spares'."]
    problems = inventory_problems({"coordinator": [], "all": ["coord"]}, hostvars())
    assert problems[0].startswith("The inventory's coordinator group has 0 hosts (none)")
    assert problems[1].startswith("The inventory's workers group is empty or missing. Fix:")


def test_every_hosts_values_named_with_the_host_and_the_fix():
    problems = inventory_problems(GROUPS, hostvars(
        worker2={"nccl_profile": "rdma"}, worker3={"shared_dir_provider": "gluster"},
        worker1={"shared_dir_provider": "nfs", "nfs_server_host": "nfs9"}))
    assert problems == [
        "host worker1: nfs_server_host=nfs9 is not a host of this inventory's coordinator or workers groups. Fix: set "
        "nfs_server_host to the inventory name of the node that exports the shared directory (default: the "
        "coordinator, coord).",
        "host worker2: nccl_profile=rdma is not a profile. Fix: set nccl_profile for worker2 (host_vars or "
        "group_vars) to auto, ib, roce or tcp.",
        "host worker3: shared_dir_provider=gluster is not known. Fix: set shared_dir_provider to preexisting (a "
        "directory already shared) or nfs (the nfs role exports one)."]
