"""Issue 26, 9 and 10, the pure parts: a failed status call tried again with backoff for a bounded time; a job
waiting in a scheduler's queue (run_status's generic queue record) shown, bounded by queue_timeout, and not counted
toward the start or the startup allowance."""
from ansible_collections.multinode.deepspeed.plugins.module_utils.run import watch

QUEUED = {"state": "queued", "label": "PENDING", "reason": "Resources", "job_id": "42", "since": 1000.0,
          "fix": "the partition's nodes are busy"}


def test_failed_calls_back_off_and_give_up_after_the_limit():
    retry = watch.StatusRetry(limit=60, first=1, most=10)
    waits = []
    now = 0.0
    while True:
        wait = retry.failed(now)
        if wait is None:
            break
        waits.append(wait)
        now += wait + 0.5  # each failed call takes half a second
    assert waits == [1, 2, 4, 8, 10, 10, 10, 10] and 55 < now <= 60 + 10


def test_a_success_starts_the_count_over():
    retry = watch.StatusRetry(limit=5, first=1)
    assert retry.failed(0.0) == 1 and retry.failed(1.0) == 2
    retry.ok()
    assert retry.failed(100.0) == 1 and retry.failures == 1 and retry.failed_since == 100.0


def test_no_try_past_the_runs_timeout_and_a_zero_limit_gives_up_at_once():
    assert watch.StatusRetry(limit=60).failed(10.0, deadline=10.5) is None
    assert watch.StatusRetry(limit=0).failed(10.0) is None


def test_the_give_up_reason_names_the_coordinator():
    reason = watch.give_up_reason("AnsibleConnectionFailure: ssh: connect to host coord port 22: Connection refused\n"
                                  "more", 61.2, "coord")
    assert reason.startswith("the coordinator coord could not be reached or read for 61s (AnsibleConnection")
    assert "more" not in reason
    assert watch.give_up_reason("", 5, "coord", timed_out=True).startswith("the run's timeout passed while the")


def test_the_options_of_the_retry_and_the_queue():
    opts = watch.watch_options({"nodes": [], "launchers": [], "status_retry": 0, "status_timeout": 5,
                                "queue_timeout": 600})
    assert (opts["status_retry"], opts["status_timeout"], opts["queue_timeout"]) == (0.0, 5.0, 600.0)
    opts = watch.watch_options({"nodes": [], "launchers": [], "queue_timeout": None})
    assert (opts["status_retry"], opts["status_timeout"], opts["queue_timeout"]) == (60.0, 30.0, None)


def test_the_queue_record_read_generically():
    assert watch.queue_state({"queue": QUEUED}) == QUEUED
    assert watch.queue_state({"queue": {"state": "started", "started": 5.0}}) is None
    assert watch.queue_state({"queue": None}) is None and watch.queue_state({}) is None
    assert watch.start_time({"queue": {"state": "started", "started": 1030.5}}) == 1030.5
    assert watch.start_time({"queue": QUEUED}) is None and watch.start_time({"queue": ["x"]}) is None


def test_the_progress_line_of_a_queued_job():
    line = watch.progress_line({"queue": QUEUED, "nodes": {"coord": {"state": "running", "time": 1130.0}}}, 1130.0)
    assert line == "queued: PENDING (Resources) 2m10s | nodes: coord running 0s"
    assert watch.queued_line(dict(QUEUED, reason=None), 1005.0) == "queued: PENDING 5s"
    assert watch.duration(3725) == "1h02m"


def test_a_queued_job_is_stopped_only_past_queue_timeout_naming_job_reason_and_fix():
    assert watch.abort_for_queue(QUEUED, 1100.0, None) is None
    assert watch.abort_for_queue(QUEUED, 1100.0, 120) is None
    verdict, reason, action = watch.abort_for_queue(QUEUED, 1130.0, 120)
    assert verdict == watch.STOPPING and action == ("abort", reason)
    assert reason == ("job 42 waited in the queue for 2m10s (queue_timeout 120s), still PENDING (Resources); "
                      "the partition's nodes are busy")


def test_the_startup_allowance_counts_from_the_jobs_start():
    # Started 10 s ago after half an hour in the queue: no stall with a startup allowance of 60 s.
    status = {"queue": {"state": "started", "started": 1790.0}, "ranks": {}}
    assert watch.stalled(status, 1800.0, watch.start_time(status), startup_timeout=60) is None
    assert watch.stalled(status, 1900.0, watch.start_time(status), startup_timeout=60)["limit"] == 60
