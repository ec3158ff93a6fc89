"""Issue 44, point 14: what a dead controller left in a namespace (a Service, its Secret, a Pending pod) is removed by
the next run there, by the collection's labels, and nothing a live run still needs is."""
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends.kubernetes import objects as k8s
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends.kubernetes import pods as k8s_pods

NOW = 1_800_000_000.0


def stamp(seconds_ago):
    import time
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW - seconds_ago))


def service(name, age, deadline="3660"):
    meta = {"name": name, "creationTimestamp": stamp(age), "labels": dict(k8s.APP, **{k8s.LABEL: name})}
    if deadline is not None:
        meta["annotations"] = {k8s.DEADLINE_ANNOTATION: deadline}
    return {"kind": "Service", "metadata": meta}


def pod(run, phase, ended_ago=None):
    status = {"phase": phase}
    if ended_ago is not None:
        status["containerStatuses"] = [{"state": {"terminated": {"exitCode": 0, "finishedAt": stamp(ended_ago)}}}]
    return {"kind": "Pod", "metadata": {"name": run + "-0", "labels": {k8s.LABEL: run}}, "status": status}


def names(found):
    return sorted(f["name"] for f in found)


def test_a_run_past_its_deadline_is_left_over_even_with_a_pending_pod():
    """A pod the scheduler never placed has no kubelet deadline: the Service's annotation is the run's."""
    found = k8s_pods.leftovers([service("mnds-a", 4000)], [pod("mnds-a", "Pending")], NOW)
    assert names(found) == ["mnds-a"] and "past the run's deadline of 3660s" in found[0]["reason"]
    assert k8s_pods.leftovers([service("mnds-a", 3000)], [pod("mnds-a", "Pending")], NOW) == []


def test_a_live_run_is_kept_and_an_ended_one_only_after_the_grace():
    services = [service("mnds-live", 50), service("mnds-collecting", 300), service("mnds-dead", 900)]
    pods = [pod("mnds-live", "Running"), pod("mnds-collecting", "Succeeded", ended_ago=30),
            pod("mnds-dead", "Failed", ended_ago=600)]
    found = k8s_pods.leftovers(services, pods, NOW)
    assert names(found) == ["mnds-dead"] and "every pod ended 600s ago" in found[0]["reason"]


def test_a_start_that_died_before_its_pods_is_left_over_after_the_grace():
    assert names(k8s_pods.leftovers([service("mnds-half", k8s_pods.LEFTOVER_GRACE + 5)], [], NOW)) == ["mnds-half"]
    assert k8s_pods.leftovers([service("mnds-new", 5)], [], NOW) == []


def test_the_run_about_to_start_and_odd_objects_are_never_named():
    assert k8s_pods.leftovers([service("mnds-me", 9999)], [], NOW, keep=["mnds-me"]) == []
    assert k8s_pods.leftovers([{"metadata": {"name": "x"}}, {}], [], NOW) == []
    # No annotation (a run from before it): only the pods' ends decide.
    assert k8s_pods.leftovers([service("mnds-old", 9999, deadline=None)], [pod("mnds-old", "Running")], NOW) == []


def test_the_service_carries_the_runs_deadline():
    job = {"run_id": "r1", "rank_hosts": ["w1"], "slots": {"w1": 1}, "accelerator": "cpu", "env": {}, "venv": "/v",
           "run_dir": "/s/runs/r1", "shared_dir": "/s", "home": "/h", "master_port": 29500, "interface": "eth0",
           "timeout": 600}
    svc = k8s.objects(job, {"namespace": "n", "image": "i:1", "fabric": "tcp", "cluster_domain": "cluster.local"})[0]
    assert svc["metadata"]["annotations"] == {k8s.DEADLINE_ANNOTATION: str(600 + k8s.DEADLINE_MARGIN)}
