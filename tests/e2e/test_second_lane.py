"""The second lane of end-to-end tests (tests/e2e/lanes.py): this session's last end-to-end test waits for it and
fails with what failed there.  It is in a session only when the second lane runs."""
import re

import lanes
import pytest

pytestmark = pytest.mark.e2e


def failures(text):
    """The second lane's short test summary (``-rfE``: a line per failed test or error) and the end of its
    output."""
    summary = [line for line in text.splitlines() if re.match(r"^(FAILED|ERROR) ", line)]
    return "\n".join(summary) + "\n---\n" + text[-12000:]


def test_the_second_lane_passed():
    rc, text = lanes.wait()
    print(text[-3000:])
    assert rc == 0, "the second lane (%s) ended with %s; its log is tests/output/lane-b.log:\n%s" % (
        ", ".join(lanes.LANE_B), rc, failures(text))
    # It ran tests and none was skipped for want of its cluster.
    assert re.search(r"\b\d+ passed\b", text), text[-3000:]
