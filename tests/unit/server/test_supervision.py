"""The parent of `workers: N` restarts a dead worker with backoff, gives up on one that
keeps dying at its start, and lets workers go when it stops (server/supervision.py)."""

from __future__ import annotations

from proxy.server.supervision import (
    GiveUp,
    LetExit,
    Restart,
    RestartPolicy,
    WorkerRun,
    exit_code,
    on_exit,
)

POLICY = RestartPolicy(first_backoff_s=0.5, max_backoff_s=4.0, max_start_failures=5)


def test_a_worker_killed_once_it_was_ready_is_started_again_at_once():
    decision = on_exit(WorkerRun(1, ready=True, start_failures=3), -9, False, POLICY)
    assert decision == Restart(after_s=0.0, start_failures=0)


def test_deaths_at_start_back_off_exponentially_up_to_the_cap():
    run, waits = WorkerRun(0), []
    for _ in range(4):
        decision = on_exit(run, 1, False, POLICY)
        assert isinstance(decision, Restart)
        waits.append(decision.after_s)
        run = WorkerRun(0, start_failures=decision.start_failures)
    assert waits == [0.5, 1.0, 2.0, 4.0]


def test_a_worker_that_keeps_dying_at_its_start_makes_the_parent_give_up():
    decision = on_exit(WorkerRun(2, start_failures=4), 1, False, POLICY)
    assert isinstance(decision, GiveUp)
    assert "worker 2 died 5 times in a row before it was ready" in decision.reason


def test_a_config_error_is_not_retried():
    assert isinstance(on_exit(WorkerRun(0, ready=True), 2, False, POLICY), GiveUp)


def test_a_worker_exiting_while_the_parent_stops_is_let_go():
    assert on_exit(WorkerRun(0, ready=True), -15, True, POLICY) == LetExit()
    assert on_exit(WorkerRun(0), 2, True, POLICY) == LetExit()


def test_the_parent_exits_zero_only_when_every_worker_stopped_cleanly():
    assert exit_code([0, 0], gave_up=False) == 0
    assert exit_code([0, -9], gave_up=False) == 1
    assert exit_code([0, 0], gave_up=True) == 1
