"""Preflight's verdicts (module_utils/preflight/verdicts.py): the summary, the findings and the table."""
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.verdicts import findings, format_verdicts, summarize, verdict


def test_summarize_findings_and_format():
    vs = [verdict("ssh", "w1", "pass", "w1 -> w1"),
          verdict("clock", "w2", "warn", "+3 s"),
          verdict("disk", "w2", "fail", "local /opt: 1.0 GiB free", "free space"),
          verdict("names", "w3", "fail", "w1: not looked up")]
    s = summarize(vs)
    assert s["status"] == "fail" and s["failed"] == vs[2:] and s["warnings"] == [vs[1]]
    assert findings(vs) == ["disk on w2: local /opt: 1.0 GiB free. Fix: free space.",
                            "names on w3: w1: not looked up."]
    assert summarize(vs[:2])["status"] == "pass"
    table = format_verdicts(vs).splitlines()
    assert table[0].split() == ["check", "host", "detail"] and table[3].split()[:3] == ["disk", "w2", "FAIL"]
