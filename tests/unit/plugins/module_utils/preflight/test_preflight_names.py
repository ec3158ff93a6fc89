"""Preflight's names check (module_utils/preflight/names.py): every node resolves every job node's name to
the address the cluster uses, and the fix follows who writes the names (/etc/hosts or the site's DNS)."""
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.names import name_verdicts
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.verdicts import WARN

from tests.unit.plugins.module_utils.preflight.preflight_data import by_host


EXPECTED = {"coord": "10.89.0.2", "worker1": "10.89.0.3", "worker2": "10.89.0.4"}


OWN = {"coord": ["10.89.0.2"], "worker1": ["10.89.0.3", "192.168.7.3"], "worker2": ["10.89.0.4"]}


def lookups(**changes):
    res = dict((n, {"addresses": [a]}) for n, a in EXPECTED.items())
    res.update(changes)
    return res


def test_names_all_resolve_right():
    res = name_verdicts({h: lookups() for h in EXPECTED}, EXPECTED, OWN)
    assert [v["host"] for v in res] == ["coord", "worker1", "worker2"]
    assert all(v["status"] == "pass" and v["check"] == "names" for v in res)
    assert res[0]["detail"] == "resolves coord, worker1, worker2"


def test_names_unresolvable_fails_naming_etc_hosts():
    res = by_host(name_verdicts(
        {"worker1": lookups(worker2={"error": "Name or service not known"}), "worker2": lookups()}, EXPECTED, OWN))
    assert res["worker2"]["status"] == "pass"
    v = res["worker1"]
    assert v["status"] == "fail" and v["detail"] == "worker2 does not resolve (Name or service not known)"
    assert v["fix"] == ("run site.yml: with cluster_hosts_file: true (the default) its cluster_hosts role writes "
                        "every inventory name into /etc/hosts on worker1 (10.89.0.4 worker2); or add worker2 to the "
                        "site's DNS and set cluster_hosts_file: false")
    empty = name_verdicts({"w1": lookups(worker2={"addresses": []})}, EXPECTED, OWN)[0]
    assert empty["status"] == "fail" and "(no address)" in empty["detail"]


def test_names_fix_says_dns_must_do_it_when_the_hosts_file_is_off():
    res = name_verdicts({"worker1": lookups(worker2={"error": "Name or service not known"})}, EXPECTED, OWN,
                        hosts_file_off=["worker1"])
    fix = res[0]["fix"]
    assert fix.startswith("cluster_hosts_file is false for worker1, so the site's DNS must resolve worker2")
    assert "add them to DNS (10.89.0.4 worker2), or set cluster_hosts_file: true" in fix
    # Several names: one fix that lists them all.
    res = name_verdicts({"coord": lookups(worker1={"error": "x"}, worker2={"error": "x"})}, EXPECTED, OWN)
    assert res[0]["fix"].count("run site.yml") == 1
    assert "(10.89.0.3 worker1, 10.89.0.4 worker2); or add worker1, worker2 to" in res[0]["fix"]


def test_names_foreign_address_fails():
    v = name_verdicts({"coord": lookups(worker1={"addresses": ["10.89.0.99"]})}, EXPECTED, OWN)[0]
    assert v["status"] == "fail"
    assert v["detail"] == "worker1 resolves to 10.89.0.99, not 10.89.0.3 (the address the cluster uses)"
    assert "/etc/hosts or DNS on coord" in v["fix"] and "should be 10.89.0.3" in v["fix"]
    assert "cluster_hosts_file" in v["fix"]


def test_names_first_address_decides():
    good = lookups(worker1={"addresses": ["10.89.0.3", "10.89.0.99"]})
    bad = lookups(worker1={"addresses": ["10.89.0.99", "10.89.0.3"]})
    assert name_verdicts({"coord": good}, EXPECTED, OWN)[0]["status"] == "pass"
    assert name_verdicts({"coord": bad}, EXPECTED, OWN)[0]["status"] == "fail"


def test_names_own_name_on_loopback_warns_but_anothers_fails():
    own = name_verdicts({"worker1": lookups(worker1={"addresses": ["127.0.1.1"]})}, EXPECTED, OWN)[0]
    assert own["status"] == "warn" and "127.0.1.1 (loopback" in own["detail"] and own["fix"] is None
    other = name_verdicts({"coord": lookups(worker1={"addresses": ["127.0.1.1"]})}, EXPECTED, OWN)[0]
    assert other["status"] == "fail"


def test_names_another_address_of_the_same_node_warns():
    v = name_verdicts({"coord": lookups(worker1={"addresses": ["192.168.7.3"]})}, EXPECTED, OWN)[0]
    assert v["status"] == "warn"
    assert v["detail"] == "worker1 resolves to 192.168.7.3, another address of worker1 (the cluster uses 10.89.0.3)"


def test_names_not_looked_up_fails_without_fix():
    res = lookups()
    del res["worker2"]
    v = name_verdicts({"coord": res}, EXPECTED, OWN)[0]
    assert v["status"] == "fail" and v["detail"] == "worker2: not looked up" and v["fix"] is None


def test_names_problems_beat_notes():
    res = lookups(worker1={"addresses": ["192.168.7.3"]}, worker2={"error": "Temporary failure in name resolution"})
    v = name_verdicts({"coord": res}, EXPECTED, OWN)[0]
    assert v["status"] == "fail" and "worker2 does not resolve" in v["detail"]


def test_a_name_without_a_known_address_is_not_compared():
    out = name_verdicts({"a": {"b": {"addresses": ["10.0.0.2"]}}}, {"b": None}, {"b": ["10.0.0.2"]})
    assert out[0]["status"] == WARN and "unknown" in out[0]["detail"]
