"""scripts/k8s_local.py's cluster DNS: packets parsed, answers built, cluster names looked up in the API."""
import importlib.util
import socket
import struct
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "k8s_local.py"
spec = importlib.util.spec_from_file_location("k8s_local", SCRIPT)
k8s_local = importlib.util.module_from_spec(spec)
spec.loader.exec_module(k8s_local)


def query(name, qtype=1, ident=0x1234):
    """A query as glibc's resolver sends it (RD set, one question)."""
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + labels + struct.pack("!HH", qtype, 1)


def test_parse_a_query():
    ident, flags, name, qtype, qclass, end = k8s_local.dns_parse(query("W-0.Svc.default.svc.cluster.local"))
    assert (ident, flags, name, qtype, qclass) == (0x1234, 0x0100, "w-0.svc.default.svc.cluster.local", 1, 1)
    assert end == len(query("w-0.svc.default.svc.cluster.local"))


@pytest.mark.parametrize("packet", [b"", b"\0" * 11, struct.pack("!HHHHHH", 1, 0, 0, 0, 0, 0),
                                    query("a.b")[:-3], query("a.b")[:13]])
def test_malformed_packets_are_refused(packet):
    with pytest.raises(ValueError):
        k8s_local.dns_parse(packet)


def test_an_a_answer():
    packet = query("w-0.w.default.svc.cluster.local")
    reply = k8s_local.dns_answer(packet, ["10.244.0.5", "10.244.0.6"])
    ident, flags, qd, an, ns, ar = struct.unpack("!HHHHHH", reply[:12])
    assert (ident, qd, an, ns, ar) == (0x1234, 1, 2, 0, 0)
    assert flags & 0x8000 and flags & 0x0100 and flags & 0x0400 and flags & 0xF == 0  # QR, RD echoed, AA, NOERROR
    assert reply[12:len(packet)] == packet[12:]  # the question, echoed
    first = reply[len(packet):len(packet) + 16]
    assert struct.unpack("!HHHIH", first[:12]) == (0xC00C, 1, 1, 5, 4)
    assert socket.inet_ntoa(first[12:]) == "10.244.0.5"
    assert socket.inet_ntoa(reply[-4:]) == "10.244.0.6"


def test_nxdomain_and_nodata():
    reply = k8s_local.dns_answer(query("nope.default.svc.cluster.local"), [], 3)
    assert struct.unpack("!H", reply[2:4])[0] & 0xF == 3 and struct.unpack("!H", reply[6:8])[0] == 0
    # An AAAA question for a name with an A record: NOERROR, no answer (the pods have IPv4 only).
    reply = k8s_local.dns_answer(query("w-0.w.default.svc.cluster.local", qtype=28), ["10.244.0.5"])
    assert struct.unpack("!H", reply[2:4])[0] & 0xF == 0 and struct.unpack("!H", reply[6:8])[0] == 0


PODS = {"items": [
    {"metadata": {"name": "w-0"}, "spec": {"hostname": "w-0", "subdomain": "w"}, "status": {"podIP": "10.244.0.5"}},
    {"metadata": {"name": "w-1"}, "spec": {"hostname": "w-1", "subdomain": "w"}, "status": {}},
    {"metadata": {"name": "w-2", "deletionTimestamp": "x"}, "spec": {"hostname": "w-2", "subdomain": "w"},
     "status": {"podIP": "10.244.0.7"}},
    {"metadata": {"name": "x"}, "spec": {}, "status": {"podIP": "10.244.0.9"}},
]}
OBJECTS = {
    "/api/v1/namespaces/default/pods": PODS,
    "/api/v1/namespaces/default/services/w": {"spec": {"clusterIP": "None"}},
    "/api/v1/namespaces/default/endpoints/w": {"subsets": [{"addresses": [{"ip": "10.244.0.5"}],
                                                            "notReadyAddresses": [{"ip": "10.244.0.6"}]}]},
    "/api/v1/namespaces/default/services/kubernetes": {"spec": {"clusterIP": "10.0.0.1"}},
}


@pytest.mark.parametrize("name, ips", [
    ("w-0.w.default.svc.cluster.local", ["10.244.0.5"]),
    ("w-1.w.default.svc.cluster.local", None),  # no IP yet
    ("w-2.w.default.svc.cluster.local", None),  # being deleted
    ("w-0.other.default.svc.cluster.local", None),
    ("w.default.svc.cluster.local", ["10.244.0.5", "10.244.0.6"]),  # headless: its endpoints, not-ready too
    ("kubernetes.default.svc.cluster.local", ["10.0.0.1"]),
    ("nope.default.svc.cluster.local", None),
    ("w-0.w.default.svc.cluster.local.default.svc.cluster.local", None),  # a search-path try
    ("example.org", None),
])
def test_lookup(name, ips):
    assert k8s_local.dns_lookup(name, OBJECTS.get) == ips


def test_a_served_query_over_udp(monkeypatch):
    """The server itself, on loopback, answering from a stubbed API."""
    import threading  # pylint: disable=import-outside-toplevel
    monkeypatch.setattr(k8s_local, "api", lambda method, path: OBJECTS.get(path))
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    args = type("Args", (), {"listen": "127.0.0.1", "port": port})()
    threading.Thread(target=k8s_local.dns_serve, args=(args,), daemon=True).start()
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.settimeout(0.2)
    reply = b""
    for _try in range(50):
        client.sendto(query("w-0.w.default.svc.cluster.local"), ("127.0.0.1", port))
        try:
            reply = client.recv(512)
            break
        except socket.timeout:
            continue
    assert socket.inet_ntoa(reply[-4:]) == "10.244.0.5"
