"""The kubernetes backend's follower (launch/backends/kubernetes/pods.py and the package's Follower), from objects a
real kube-apiserver (v1.20.2, scripts/k8s-local) returned: pods the scheduler could not place, pods placed on nodes
that stopped reporting.  Preflight's verdicts on the same objects: preflight/test_preflight_kubernetes.py."""
import copy
import json

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends.kubernetes import pods as k8s
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends import kubernetes as kb
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.job import JobError

from tests.unit.plugins.module_utils.k8s_cluster import gpu_job, load, ready_nodes


def test_a_pod_the_scheduler_cannot_place_stops_the_run_with_the_schedulers_words():
    pods = load("pods-unschedulable.json")
    since = k8s.pod_state(pods[2])["unschedulable_since"]
    hosts = ["worker1", "worker2", "worker3"]
    assert k8s.pod_problems(pods, ready_nodes(), hosts, since + 5) == []  # the scheduler may still place it
    problems = k8s.pod_problems(pods, ready_nodes(), hosts, since + k8s.UNSCHEDULABLE_GRACE)
    assert len(problems) == 1
    host, pod, msg, lost = problems[0]
    assert (host, pod, lost) == ("worker3", "mnds-t2-2", False)
    assert "cannot be scheduled: 0/4 nodes are available: 2 Insufficient nvidia.com/gpu" in msg and "Fix:" in msg


def test_pods_on_nodes_that_stopped_reporting_are_lost():
    pods = load("pods-node-lost.json")
    problems = k8s.pod_problems(pods, ready_nodes(), ["worker1", "worker2"], 2e9)
    assert [(h, p, lost) for h, p, _m, lost in problems] == [("worker1", "mnds-t1-0", True),
                                                             ("worker2", "mnds-t1-1", True)]
    assert "node fake-a is not ready (Ready=Unknown: Kubelet stopped posting node status.)" in problems[0][2]


def test_placed_pods_on_ready_nodes_are_no_problem():
    pods = load("pods-unschedulable.json")[:2]  # on fake-c and fake-d, both Ready
    assert k8s.pod_problems(pods, ready_nodes(), ["worker1", "worker2"], 2e9) == []


def with_container(pod, state, restarts=0, phase="Pending"):
    pod = copy.deepcopy(pod)
    pod["status"]["phase"] = phase
    pod["status"]["containerStatuses"] = [{"name": "ranks", "restartCount": restarts, "state": state,
                                           "ready": False, "image": "mnds-node:1", "imageID": ""}]
    return pod


def test_a_container_that_cannot_start_or_restarts_names_the_fix():
    base = load("pods-unschedulable.json")[0]
    nodes = ready_nodes()
    pull = with_container(base, {"waiting": {"reason": "ErrImageNeverPull",
                                             "message": 'Container image "mnds-node:1" is not present'}})
    (_h, _p, msg, lost), = k8s.pod_problems([pull], nodes, ["worker1"], 2e9)
    assert "pod mnds-t2-0 on node fake-d cannot start: ErrImageNeverPull" in msg and "load the image" in msg
    assert not lost
    creating = with_container(base, {"waiting": {"reason": "ContainerCreating"}})
    assert k8s.pod_problems([creating], nodes, ["worker1"], 2e9) == []
    restarted = with_container(base, {"running": {"startedAt": "2026-11-24T10:00:00Z"}}, restarts=1,
                               phase="Running")
    (_h, _p, msg, _l), = k8s.pod_problems([restarted], nodes, ["worker1"], 2e9)
    assert "restarted 1 time(s)" in msg
    failed = copy.deepcopy(base)
    failed["status"].update(phase="Failed", reason="Evicted", message="The node was low on resource: memory.")
    (_h, _p, msg, lost), = k8s.pod_problems([failed], nodes, ["worker1"], 2e9)
    assert "failed: The node was low on resource: memory." in msg and lost


def test_a_missing_pod_is_named_after_a_grace():
    events = [{"reason": "FailedCreate", "message": 'create Pod mnds-t2-1 in StatefulSet mnds-t2 failed error: '
               'pods "mnds-t2-1" is forbidden: exceeded quota: gpus'}]
    pods = load("pods-unschedulable.json")[:1]
    assert k8s.pod_problems(pods, ready_nodes(), ["worker1", "worker2"], 100, created=90, events=events) == []
    (host, pod, msg, _l), = k8s.pod_problems(pods, ready_nodes(), ["worker1", "worker2"], 200, created=90,
                                             events=events)
    assert (host, pod) == ("worker2", None) and "exceeded quota: gpus" in msg


class FakeApi(object):
    def __init__(self, pods, nodes, sts=True, fail=0):
        self._pods, self._nodes, self._sts, self.fail, self.deleted = pods, nodes, sts, fail, []

    def pods(self, namespace, name):
        if self.fail:
            self.fail -= 1
            raise OSError("connection refused")
        return self._pods

    def nodes(self):
        return self._nodes

    def service(self, namespace, name):
        return {"metadata": {"name": name, "creationTimestamp": "2026-11-24T10:00:00Z"}} if self._sts else None

    def events(self, namespace, name):
        return []

    def delete_run(self, namespace, name):
        self.deleted.append((namespace, name))
        return ["Service/" + name]


def test_the_follower_names_the_rank_host_and_deletes_unless_kept():
    job = gpu_job()
    spec = job["launch"]["follow"]
    assert spec == {"backend": "kubernetes", "kubeconfig": "/k/config", "context": None, "namespace": "default",
                    "name": "mnds-t2", "hosts": ["worker1", "worker2"], "keep": False}
    api = FakeApi(load("pods-node-lost.json"), ready_nodes())
    follower = kb.Follower(spec, api=api)
    problems = follower.poll(2e9)
    assert [(h, lost) for h, _m, lost in problems] == [("worker1", True), ("worker2", True)]
    assert problems[0][1].startswith("worker1 (pod mnds-t1-0 on node fake-a: node fake-a is not ready")
    assert follower.progress() == "pods 0/2 running (mnds-t1-0 Pending on fake-a, mnds-t1-1 Pending on fake-b)"
    assert [p["node"] for p in follower.record()["pods"]] == ["fake-a", "fake-b"]
    assert follower.stop() == ["Service/mnds-t2"] and api.deleted == [("default", "mnds-t2")]
    kept = kb.Follower(dict(spec, keep=True), api=api)
    assert kept.stop() == [] and len(api.deleted) == 1


def test_the_follower_stops_the_run_when_the_api_keeps_failing_or_the_statefulset_goes():
    spec = gpu_job()["launch"]["follow"]
    follower = kb.Follower(spec, api=FakeApi([], ready_nodes(), fail=kb.Follower.API_FAILURES))
    for _try in range(kb.Follower.API_FAILURES - 1):
        assert follower.poll(0) == []
    (_h, msg, _l), = follower.poll(0)
    assert "the Kubernetes API does not answer (5 tries: connection refused)" in msg
    gone = kb.Follower(spec, api=FakeApi([], ready_nodes(), sts=False))
    (_h, msg, _l), = gone.poll(0)
    assert "Service default/mnds-t2 is gone" in msg


def test_the_plan_starts_no_agent_over_ssh_and_gives_the_watch_no_ssh_probe():
    launch = gpu_job()["launch"]
    assert launch["ssh_agents"] == [] and launch["agents"] == ["worker1", "worker2"]
    assert launch["steps"] == dict((s, "kubernetes/" + s) for s in ("preflight", "check", "start", "finish")) and launch["probe_nodes"] is False
    assert launch["extra"]["per_pod"] == {"nvidia.com/gpu": 2} and launch["extra"]["pods"] == 2
    assert [o["kind"] for o in launch["extra"]["objects"]] == ["Service", "Pod", "Pod"]
    # Deleted owned objects first: the Service's cascade never removes a pod the play is about to delete by name.
    assert launch["extra"]["delete"] == [{"kind": "Pod", "name": "mnds-t2-0"}, {"kind": "Pod", "name": "mnds-t2-1"},
                                         {"kind": "Secret", "name": "mnds-t2-secrets"},
                                         {"kind": "Service", "name": "mnds-t2"}]


def test_running_only_when_every_planned_pod_runs():
    spec = gpu_job()["launch"]["follow"]
    base = load("pods-unschedulable.json")[:2]
    follower = kb.Follower(spec, api=FakeApi(base, ready_nodes()))
    follower.poll(2e9)
    assert not follower.running()
    up = [with_container(p, {"running": {"startedAt": "2026-11-24T10:00:00Z"}}, phase="Running") for p in base]
    follower = kb.Follower(spec, api=FakeApi(up[:1], ready_nodes()))
    follower.poll(2e9)
    assert not follower.running()  # one of two
    follower = kb.Follower(spec, api=FakeApi(up, ready_nodes()))
    assert follower.poll(2e9) == [] and follower.running() and follower.progress() == "pods 2/2 running"


def test_the_runs_secrets_are_a_secret_volume_where_the_ranks_read_them():
    job = gpu_job(secret_env={"WANDB_API_KEY": "wandb-value-4711"}, hf_token_set=True)
    sts = job["launch"]["extra"]["objects"][1]
    pod = sts["spec"]
    (vol,) = [v for v in pod["volumes"] if v["name"] == "secrets"]
    assert vol["secret"]["secretName"] == job["launch"]["extra"]["secret"] == "mnds-t2-secrets"
    assert vol["secret"]["items"] == [{"key": "hf_token", "path": "hf_token"},
                                      {"key": "secret_env", "path": "runs/%s.json" % job["run_id"]}]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "secrets"]
    assert mount == {"name": "secrets", "mountPath": job["home"] + "/secrets", "readOnly": True}
    assert job["env"]["HF_TOKEN_PATH"] == job["home"] + "/secrets/hf_token"
    assert job["secret_file"] == "%s/secrets/runs/%s.json" % (job["home"], job["run_id"])
    assert "wandb-value-4711" not in json.dumps(job["launch"])  # the value never enters the plan's objects
    plain = gpu_job()["launch"]["extra"]["objects"][1]["spec"]
    assert "secrets" not in [v["name"] for v in plain["volumes"]]


def test_values_that_reach_the_pods_are_checked_by_the_plan():
    good = gpu_job(k8s_image="registry.local:5000/team/mnds-node:1.2", k8s_shm_size="8Gi")
    container = good["launch"]["extra"]["objects"][1]["spec"]["containers"][0]
    assert container["image"] == "registry.local:5000/team/mnds-node:1.2"
    for settings, expect in (({"k8s_image": "mnds node;rm -rf /"}, "k8s_image='mnds node;rm -rf /' is not an image"),
                             ({"k8s_cluster_domain": "cluster.local\nNCCL_X=1"}, "is not a DNS domain"),
                             ({"k8s_shm_size": "lots"}, "k8s_shm_size='lots' is not a Kubernetes quantity")):
        with pytest.raises(JobError) as err:
            gpu_job(**settings)
        assert expect in str(err.value) and "Fix:" in str(err.value), (settings, str(err.value))
