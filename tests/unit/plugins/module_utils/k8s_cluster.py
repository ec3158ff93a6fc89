"""What the unit tests of the kubernetes backend (launch/) and of its preflight verdicts (preflight/) share: objects a
real kube-apiserver (v1.20.2, scripts/k8s-local) returned, and a planned job of GPU workers."""
import datetime
import json
from pathlib import Path

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.job import plan

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "k8s"
NOW = datetime.datetime(2026, 11, 24, 2, 0, 0)


def load(name):
    return json.loads((FIXTURES / name).read_text())


def ready_nodes():
    """fake-c and fake-d: 2 GPUs each, Ready; fake-a and fake-b: no longer reporting (Unknown, tainted)."""
    return load("nodes.json")


def gpu_job(slots=(2, 2), **settings):
    workers = dict(("worker%d" % (i + 1), {"slots": s, "gpus": s, "address": "10.89.0.1%d" % (i + 1),
                                           "memtotal_mb": 65536, "interface": "eth0", "env": {}})
                   for i, s in enumerate(slots))
    base = {"run_id": "t2", "backend": "kubernetes", "k8s_image": "mnds-node:1", "k8s_kubeconfig": "/k/config"}
    base.update(settings)
    return plan(base, workers, ["coord"], NOW, backends)
