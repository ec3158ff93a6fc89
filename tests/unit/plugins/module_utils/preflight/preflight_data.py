"""What the preflight tests share: the real all-reduce results (tests/fixtures/preflight), tests built from
(bytes, seconds) pairs, a node's stack, the master port test as Ansible registers it, and the plan's ``launch`` of
a backend."""
import json
from pathlib import Path

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.bandwidth import bus_factor

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures"
PREFLIGHT = FIXTURES / "preflight"
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def launch_of(backend, coordinators=(), rank_hosts=()):
    """What the plan records of a backend's launch (``job["launch"]``, ``Backend.describe``) that preflight reads: the
    SSH logins it needs and whether ranks start over SSH."""
    chosen = backends.get(backend)
    job = {"coordinators": list(coordinators), "rank_hosts": list(rank_hosts)}
    return {"ssh_pairs": [list(p) for p in chosen.ssh_pairs(job)], "ranks_over_ssh": chosen.ranks_over_ssh}


def load(name):
    return json.loads((PREFLIGHT / name).read_text())


def raw_of(world_size, pairs):
    """A raw result as multinode_ds.allreduce_perf writes it: (bytes, seconds) pairs."""
    return {"world_size": world_size,
            "results": [{"bytes": b, "count": b // 4, "dtype": "float32", "iters": 10, "seconds": s}
                        for b, s in pairs]}


def passing_test(label, busbw_gbps, world_size=2):
    """A finished test whose only (64 MiB) message reaches busbw_gbps on world_size ranks."""
    nbytes = 64 * MIB
    algbw = busbw_gbps / bus_factor(world_size)
    return {"label": label, "ok": True, "error": "", "raw": raw_of(world_size, [(nbytes, nbytes / algbw / 1e9)])}


STACK = {"python": "3.11.2", "torch": "2.13.0+cu128", "cuda": "12.8", "nccl": "2.27.3", "deepspeed": "0.19.8",
         "transformers": "4.57.1", "trainer": "0.3.0"}
CPU_COORD = dict(STACK, torch="2.13.0+cpu", cuda=None, nccl=None)


def by_host(verdicts):
    return dict((v["host"], v) for v in verdicts)


# What Ansible registers: async_status of the listener (poll 0), and the loop of connections.
LISTENER_OK = {"ansible_job_id": "j123.456", "finished": 1, "started": 1, "changed": False, "rc": 0,
               "stdout": "", "stderr": "", "cmd": ["python3", "-c", "...", "29500", "20", "2"]}
LISTENER_TAKEN = dict(LISTENER_OK, rc=1,
                      stderr="port 29500 is not free: [Errno 98] Address already in use\n")
PROBES_OK = [{"item": "worker1", "ansible_loop_var": "item", "changed": False, "rc": 0, "stdout": "", "stderr": ""},
             {"item": "worker2", "ansible_loop_var": "item", "changed": False, "rc": 0, "stdout": "", "stderr": ""}]
