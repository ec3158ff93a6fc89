"""The agents' lease follows the watch's retry window (issue 44, point 6): a coordinator the watch still retries is
never given up by its agents first; the one number is the watch's, and the plan passes what it derives."""
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends
from ansible_collections.multinode.deepspeed.plugins.module_utils.common import lease
from ansible_collections.multinode.deepspeed.plugins.module_utils.common.lease import (
    POLL_INTERVAL, STATUS_RETRY, STATUS_TIMEOUT, lease_timeout, renewal_gap)
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.watch import StatusRetry, watch_options


def longest_silence(retry, status_timeout, poll_interval):
    """The watch's own loop, worst case: the lease renewed at 0 by a call; the next call starts after its long
    poll and hangs until status_timeout; each try after that also hangs, after StatusRetry's wait; the last try
    (the one the watch makes before it would give up) succeeds only as it times out. Returns when it renews the
    lease: the longest the lease goes unrenewed while the watch still tries."""
    tries = StatusRetry(retry)
    now = poll_interval + status_timeout  # the first failure is known only when its call gives up
    last_start = poll_interval
    while True:
        wait = tries.failed(now)
        if wait is None:
            return last_start + status_timeout
        last_start = now + wait
        now = last_start + status_timeout


def test_the_lease_outlasts_the_watchs_retries_with_a_margin():
    silence = longest_silence(STATUS_RETRY, STATUS_TIMEOUT, POLL_INTERVAL)
    assert silence <= renewal_gap() < lease_timeout()
    assert lease_timeout() - renewal_gap() == lease.LEASE_MARGIN >= 10
    # The agents' former fixed 45 s fell inside the window: a 50 s outage the watch rode out killed the run.
    outage, former_lease = 50, 45
    assert former_lease < outage < silence
    # Other settings move it with them.
    assert longest_silence(120, 10, 2) <= renewal_gap(120, 10, 2) < lease_timeout(120, 10, 2)


def test_the_watchs_defaults_are_the_ones_the_lease_is_derived_from():
    opts = watch_options({"nodes": [], "launchers": []})
    assert (opts["status_retry"], opts["status_timeout"], opts["poll_interval"]) == (
        STATUS_RETRY, STATUS_TIMEOUT, POLL_INTERVAL)
    assert StatusRetry().limit == STATUS_RETRY


def test_every_agent_of_every_backend_gets_the_derived_lease():
    job = {"coordinators": ["c1"], "rank_hosts": ["a", "b"], "venv": "/v", "run_dir": "/r/1", "run_id": "r1",
           "timeout": 60}
    for name, backend in sorted(backends.REGISTRY.items()):
        for launch in (None, ["x"]):
            argv = backend.stop.agent_argv(job, "a", launch)
            assert float(argv[argv.index("--lease-timeout") + 1]) == lease_timeout(), name
            assert argv[argv.index("--run-id") + 1] == "r1", name  # an attempt's directory is not the run's id
