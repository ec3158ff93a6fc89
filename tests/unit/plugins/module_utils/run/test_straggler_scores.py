"""Stragglers named from the ranks' compute times (issue 47, point 2): module_utils/run/stragglers.py, with the
per-rank records of a real run on the local cluster whose worker2 was limited to a third of a core at step 27
(tests/fixtures/stragglers/throttled/rank<N>.jsonl) and synthetic ones."""
import json
from pathlib import Path

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.run import stragglers
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.stragglers import Stragglers, replay

FIXTURE = Path(__file__).resolve().parents[4] / "fixtures" / "stragglers" / "throttled"


def step(rank, n, compute, host):
    return {"event": "step", "step": n, "rank": rank, "host": host, "compute": compute, "step_time": compute * 3}


def polls(times, hosts=("worker1", "worker2")):
    """One poll per step: rank r on hosts[r] took times[r](step) seconds of compute."""
    for n in range(1, 200):
        yield dict((r, step(r, n, times[r](n), hosts[r])) for r in range(len(hosts)))


def load_fixture():
    records = {}
    for path in sorted(FIXTURE.glob("rank*.jsonl")):
        records[int(path.stem[4:])] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return records


def test_equal_ranks_score_one_and_nobody_is_named():
    tracker = Stragglers()
    for poll in list(polls([lambda n: 0.10, lambda n: 0.10 + 0.002 * (n % 3)]))[:50]:
        tracker.see(poll)
    assert tracker.scores()["worker1"] == 1.0 and tracker.scores()["worker2"] > 0.9
    assert not tracker.flagged and tracker.line() is None and not tracker.newly_flagged()


def test_a_node_three_times_slower_is_named_after_the_set_number_of_steps():
    tracker = Stragglers(threshold=0.7, steps=10)
    named_at = None
    for poll in list(polls([lambda n: 0.1, lambda n: 0.1 if n < 20 else 0.3]))[:60]:
        tracker.see(poll)
        if tracker.flagged and named_at is None:
            named_at = poll[0]["step"]
    # Half of the last 8 samples are slow at step 23 (median 0.2: score 0.5); ten steps below 0.7 name it at 32.
    assert named_at == 32
    flag = tracker.flagged["worker2"]
    assert flag["since_step"] == 23 and flag["score"] == pytest.approx(1 / 3, abs=0.01)
    assert tracker.line() == "straggler: worker2 (score 0.33)"
    assert tracker.newly_flagged() == [flag] and tracker.newly_flagged() == []
    assert stragglers.describe(flag) == ("worker2 is a straggler: its ranks compute at 33% of the fastest rank's pace "
                                         "(score 0.33) since step 23")


def test_a_short_slowdown_is_not_a_straggler():
    """A checkpoint write or a neighbour's burst: 5 slow steps, fewer than straggler_steps below the threshold."""
    tracker = Stragglers(threshold=0.7, steps=10)
    for poll in list(polls([lambda n: 0.1, lambda n: 0.4 if 30 <= n < 35 else 0.1]))[:80]:
        tracker.see(poll)
    assert not tracker.flagged
    assert min(e["scores"]["worker2"] for e in tracker.record()["history"]) < 0.7  # seen, not named


def test_a_node_that_recovers_is_no_longer_shown():
    tracker = Stragglers(threshold=0.7, steps=5)
    for poll in list(polls([lambda n: 0.1, lambda n: 0.3 if n < 30 else 0.1]))[:60]:
        tracker.see(poll)
    assert "worker2" in tracker.flagged and tracker.line() is None and tracker.scores()["worker2"] == 1.0


def test_a_node_is_as_slow_as_its_slowest_rank_and_polls_that_repeat_a_step_count_once():
    tracker = Stragglers(steps=3)
    for n in range(1, 12):
        poll = {0: step(0, n, 0.1, "w1"), 1: step(1, n, 0.1, "w2"), 2: step(2, n, 0.5, "w2")}
        tracker.see(poll).see(poll)
    assert tracker.scores() == {"w1": 1.0, "w2": pytest.approx(0.2)}
    assert len(tracker.samples[2]) == 8  # the window, each step once
    assert tracker.rank_scores()[1] == 1.0


def test_no_score_without_compute_or_before_every_rank_has_samples():
    tracker = Stragglers()
    tracker.see({0: step(0, 1, 0.1, "w1"), 1: dict(step(1, 1, 0.1, "w2"), compute=None)})
    tracker.see({0: step(0, 2, 0.1, "w1"), 1: {"event": "start", "rank": 1}})
    assert tracker.scores() == {} and tracker.slowest() is None and tracker.record()["history"] == []
    assert replay({0: [{"event": "step", "step": 1, "step_time": 0.1}]}) is None


def test_the_throttled_run_is_named_from_its_real_records():
    records = load_fixture()
    assert sorted(records) == [0, 1]
    hosts = dict((r, next(x["host"] for x in recs if x.get("host"))) for r, recs in records.items())
    assert sorted(hosts.values()) == ["worker1", "worker2"]
    record = replay(records, 0.7, 10)
    assert [f["node"] for f in record["flagged"]] == ["worker2"]
    flag = record["flagged"][0]
    # Limited right before step 27 (the fixture's README): named within 30 steps of it, at under half the pace.
    assert 27 <= flag["since_step"] and flag["step"] <= 27 + 30 and flag["score"] < 0.5
    before = [e for e in record["history"] if 10 <= e["step"] < 27]
    assert before and all(e["scores"]["worker2"] > 0.7 for e in before)
    assert record["scores"]["worker1"] == 1.0
    lines = stragglers.lines(record)
    assert lines[0].startswith("Compute pace per node (1.0: the fastest rank's; a straggler stays below 0.70 for 10 "
                               "steps): worker1 1.00, worker2 0.")
    assert lines[1] == "- **straggler**: %s." % stragglers.describe(flag)


def test_a_poll_that_lists_the_steps_before_the_last_samples_each_once_and_judges_each_step():
    """run_status's tail holds many steps of a fast run: rank_progress lists their compute (``computes``), and the
    straggler is named at the step its evidence was complete, not at the poll's last step."""
    tracker = Stragglers(steps=5)
    first = {0: dict(step(0, 6, 0.1, "w1"), computes=[[n, 0.1] for n in range(1, 7)]),
             1: dict(step(1, 6, 0.3, "w2"), computes=[[n, 0.3] for n in range(1, 7)])}
    tracker.see(first)
    assert len(tracker.samples[0]) == 6 and tracker.step == 6
    # Scored from step 3 (three samples of every rank), below the threshold since then: 4 steps, not yet 5.
    assert tracker.scores() == {"w1": 1.0, "w2": pytest.approx(1 / 3)} and not tracker.flagged
    assert tracker.below_since == {"w2": 3}
    again = {0: dict(step(0, 12, 0.1, "w1"), computes=[[n, 0.1] for n in range(4, 13)]),
             1: dict(step(1, 12, 0.3, "w2"), computes=[[n, 0.3] for n in range(4, 13)])}
    tracker.see(again).see(again)
    assert len(tracker.samples[0]) == 8 and tracker.sampled == {0: 12, 1: 12} and tracker.step == 12
    assert tracker.flagged["w2"]["since_step"] == 3 and tracker.flagged["w2"]["step"] == 7


def test_replace_waits_for_the_checkpoint_it_asked_for():
    ranks = {0: {"event": "step", "step": 41, "saved_step": 40}, 1: {"event": "step", "step": 41, "saved_step": 35}}
    assert not stragglers.saved_since(ranks, 40)
    ranks[1]["saved_step"] = 40
    assert stragglers.saved_since(ranks, 40) and not stragglers.saved_since({}, 1)
    assert stragglers.save_wait(0) == 60.0 and stragglers.save_wait(45) == 135.0
    why = "worker2 is a straggler: its ranks compute at 31% of the fastest rank's pace (score 0.31) since step 24"
    assert stragglers.moved_reason(why, True, 40, 3.0) == why + "; the run was checkpointed at step 40 and moves off it"
    assert stragglers.moved_reason(why, False, None, 61.2).endswith(
        "; no checkpoint came within 61s, so the next attempt resumes from the newest one")


def test_a_host_name_a_rank_wrote_is_used_only_when_it_is_a_host_name():
    """Rank code is the user's: a 'host' with markup or newlines never reaches the report or the progress line."""
    tracker = Stragglers(steps=1)
    for n in range(1, 6):
        tracker.see({0: step(0, n, 0.1, "worker1"), 1: step(1, n, 0.4, "](x)\n**bad**")})
    assert set(tracker.scores()) == {"worker1", "rank 1"} and "rank 1" in tracker.flagged


def test_the_checkpoint_that_answered_the_ask_is_the_trainers_answer_else_the_ranks_save_records():
    saved_at = stragglers.saved_at
    ranks = {"0": {"event": "step", "step": 90}, "1": {"event": "step", "step": 90}}
    # A fast run's save records left the lines a poll reads: control/SAVED still says which step answered.
    assert saved_at({"ranks": ranks, "saved": {"step": 61, "time": 1.0}}, 60) == 61
    assert saved_at({"ranks": ranks, "saved": {"step": 50}}, 60) is None
    assert saved_at({"ranks": ranks, "saved": {"step": "x"}}, 60) is None
    seen = dict((r, dict(rec, saved_step=62)) for r, rec in ranks.items())
    assert saved_at({"ranks": seen, "saved": None}, 60) == 62
    assert saved_at({"ranks": dict(seen, **{"1": ranks["1"]})}, 60) is None
