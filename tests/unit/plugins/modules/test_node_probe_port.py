"""node_probe's master port test: listening (listen_port) and connecting (connect_host/connect_port) in one call,
on localhost sockets only."""
import socket
import time

from ansible_collections.multinode.deepspeed.plugins.modules import node_probe


def free_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def test_listen_and_connect_in_one_call(run_module):
    port = free_port()
    before = time.time()
    res = run_module(node_probe, {"listen_port": port, "listen_expect": 1, "listen_seconds": 5,
                                  "connect_host": "127.0.0.1", "connect_port": port, "connect_seconds": 5})
    assert res.get("failed") is not True, res
    assert res["listen"] == {"rc": 0, "msg": "", "accepted": 1}
    assert res["connect"]["rc"] == 0 and res["connect"]["msg"] == "" and res["connect"]["seconds"] < 5
    assert before <= res["time"] <= time.time()
    assert 0 <= res["elapsed"] < 5
    assert res["changed"] is False
    # The port is free again once the probe returns (no listener and no TIME_WAIT on the server side).
    again = socket.socket()
    try:
        again.bind(("", port))
    finally:
        again.close()


def test_listen_on_a_taken_port(run_module):
    holder = socket.socket()
    holder.bind(("", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        res = run_module(node_probe, {"listen_port": port, "listen_seconds": 5})
    finally:
        holder.close()
    assert res["listen"]["rc"] == 1 and res["listen"]["accepted"] == 0
    assert ("port %d is not free" % port) in res["listen"]["msg"]
    assert "connect" not in res
    assert res["elapsed"] < 2


def test_connect_to_a_closed_port(run_module):
    # Bound but not listening: connections are refused, and nothing else can take the port meanwhile.
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    try:
        res = run_module(node_probe, {"connect_host": "127.0.0.1", "connect_port": port, "connect_seconds": 1})
    finally:
        closed.close()
    conn = res["connect"]
    assert conn["rc"] == 1 and conn["seconds"] >= 1
    assert "(for 1 s)" in conn["msg"] and "refused" in conn["msg"].lower()
    assert "listen" not in res
    assert res["elapsed"] >= 1 and "time" in res


def test_no_port_options_no_port_results(run_module):
    res = run_module(node_probe, {})
    assert "listen" not in res and "connect" not in res
    assert isinstance(res["time"], float) and isinstance(res["elapsed"], float)


def test_connect_host_needs_connect_port(run_module):
    res = run_module(node_probe, {"connect_host": "127.0.0.1"})
    assert res["failed"] is True and "connect_host" in res["msg"] and "connect_port" in res["msg"]
