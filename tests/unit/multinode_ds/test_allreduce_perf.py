"""The all-reduce test preflight.yml runs on the nodes (multinode_ds/allreduce_perf.py): its sizes, its check,
its result; and a real run of two gloo ranks on this machine."""
import json
import os
import socket
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from multinode_ds import allreduce_perf as ar

ROOT = Path(__file__).resolve().parents[3]


def test_sizes_double_up_to_the_largest_and_iterations_shrink_with_them():
    assert ar.sizes(4096, 65536) == [4096, 8192, 16384, 32768, 65536]
    assert ar.sizes(4097, 20000) == [4096, 8192, 16384, 20000]
    assert ar.sizes(1, 8) == [4, 8]
    assert ar.iterations(4096) == ar.MAX_ITERS and ar.iterations(64 << 20) == ar.MIN_ITERS
    assert ar.iterations(8 << 20) == 8


def test_the_sum_every_rank_must_see():
    assert [ar.expected_sum(w) for w in (1, 2, 8)] == [1.0, 3.0, 36.0]


def test_the_result_names_the_hosts_the_versions_and_the_settings(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("NCCL_IB_HCA", "mlx5_0")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth1")
    monkeypatch.setenv("OTHER", "x")
    args = Namespace(label="ib", backend="gloo")
    rows = [{"bytes": 4096, "count": 1024, "dtype": "float32", "iters": 50, "seconds": 1e-4}]
    doc = ar.result_doc(args, ["n1", "n1", "n2"], torch.device("cpu"), 0.12345, rows)
    assert doc["world_size"] == 3 and doc["nodes"] == 2 and doc["rank_hosts"] == ["n1", "n1", "n2"]
    assert doc["device"] == "cpu" and doc["nccl"] is None and doc["init_seconds"] == 0.123
    assert doc["env"] == {"GLOO_SOCKET_IFNAME": "eth1", "NCCL_IB_HCA": "mlx5_0"} and doc["results"] == rows
    assert (doc["label"], doc["op"], doc["reduce_op"], doc["torch"]) == ("ib", "all_reduce", "sum", torch.__version__)


def test_the_result_file_is_written_whole(tmp_path):
    out = tmp_path / "preflight" / "ib.json"
    ar.write_result(str(out), {"results": []})
    assert out.read_text() == '{\n  "results": []\n}\n' and not (tmp_path / "preflight" / "ib.json.tmp").exists()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def allreduce_perf(*argv):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "multinode_ds.allreduce_perf", "--master-addr", "127.0.0.1",
                           "--master-port", str(free_port()), *argv], env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_two_gloo_ranks_on_one_node(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "preflight" / "ib.json"
    proc = allreduce_perf("--world-size", "2", "--first-rank", "0", "--nproc", "2", "--min-bytes", "4096",
                          "--max-bytes", "8192", "--node", "node-a", "--label", "default", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert [line.split()[:4] for line in lines[:2]] == [["4096", "bytes", "50", "iters"], ["8192", "bytes", "50", "iters"]]
    assert lines[-1].startswith(ar.RESULT_PREFIX)
    doc = json.loads(lines[-1][len(ar.RESULT_PREFIX):])
    assert doc == json.loads(out.read_text())
    assert doc["world_size"] == 2 and doc["rank_hosts"] == ["node-a", "node-a"] and doc["label"] == "default"
    assert [(r["bytes"], r["count"], r["iters"]) for r in doc["results"]] == [(4096, 1024, 50), (8192, 2048, 50)]
    assert all(r["seconds"] > 0 for r in doc["results"])
