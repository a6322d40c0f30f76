"""Measuring on the RPC servers of a key, as many at once as are free: every wait bounded, failing at once
when the device goes away."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any, NamedTuple

from kiln_tvm import derived_object, ms
from tuner.entities import RunnerSpec
from tuner.errors import InvalidSpec
from tuner.metaschedule.deadline_workers import DeadlineWorkers
from tuner.metaschedule.runner import DoneFuture, measure_filler, run_calibrated_evaluator
from tuner.rpc.device_info import server_name
from tuner.rpc.tracker import (
    DEFAULT_CHECK_TIMEOUT_S,
    DEFAULT_QUEUE_TIMEOUT_S,
    DEFAULT_SESSION_TIMEOUT_S,
    check_runner,
    parse_tracker,
)


@derived_object
class GuardedRPCRunner(ms.runner.PyRunner):
    """Measures a batch of candidates on the RPC servers of a key, one candidate per server at a time, on
    as many servers at once as the key has (up to one per worker), failing when the device goes.

    A batch runs in waves: before each, the tracker says how many servers the key has, and the wave takes
    that many candidates (at least one, at most one per worker), each in a session of its own: the tracker
    hands each session a different server, and a server measures one candidate at a time. Every session
    ends with its candidate, so between waves the servers are back at the tracker, whose queue serves
    the requests of every job measuring on the key in the order they came. A candidate whose server
    disappeared mid-wave (the key has fewer servers after the wave than before it) is measured again in
    the next wave; a job whose device disappeared fails with ``DeviceUnavailable`` at once instead of
    timing out candidate after candidate. Each candidate is measured in a worker process whose call this
    process ends by its deadline (:class:`~tuner.metaschedule.deadline_workers.DeadlineWorkers`), so no
    stuck session holds the job. ``served`` counts the candidates each server measured (``host:port``;
    ``?`` for a server that is not Kiln's).
    """

    def __init__(
        self,
        workers: DeadlineWorkers,
        measurement: Measurement,
        runner: RunnerSpec,
        *,
        check_timeout_s: float,
    ) -> None:
        super().__init__()
        self.workers = workers
        self.measurement = measurement
        self.runner = runner
        self.check_timeout_s = check_timeout_s
        self.served: Counter[str] = Counter()

    def run(self, runner_inputs: list[Any]) -> list[Any]:
        results: dict[int, Any] = {}
        waiting = list(range(len(runner_inputs)))
        retried: set[int] = set()
        queue = check_runner(self.runner, self.check_timeout_s)
        while waiting:
            # The key's servers, busy or not: a server that just ended a session of this job's shows as
            # busy for a moment, and one another job holds is waited for in the tracker's queue, in turn.
            width = min(self.workers.count, max(1, queue.total if queue is not None else 1))
            wave, waiting = waiting[:width], waiting[width:]
            before = queue.total if queue is not None else 0
            measured = self.workers.run(measure_on_server, [self._call(runner_inputs[i]) for i in wave])
            outcomes = {i: self._result(outcome) for i, outcome in zip(wave, measured, strict=True)}
            results.update(outcomes)
            queue = check_runner(self.runner, self.check_timeout_s)
            if queue is not None and queue.total < before:  # a server went: its candidate goes again
                again = [i for i, r in outcomes.items() if r.error_msg and i not in retried]
                retried.update(again)
                waiting = again + waiting
        return [DoneFuture(results[i]) for i in range(len(runner_inputs))]

    def shutdown(self) -> None:
        """Stop the worker processes."""
        self.workers.shutdown()

    def _call(self, runner_input: Any) -> tuple[Any, ...]:
        args_info = [info.as_json() for info in runner_input.args_info]
        return (self.measurement, runner_input.artifact_path, runner_input.device_type, args_info)

    def _result(self, outcome: Any) -> Any:
        if isinstance(outcome, TimeoutError):
            return ms.runner.RunnerResult(None, error_msg="RPCRunner: Timeout")
        if isinstance(outcome, BaseException):  # any failure is this candidate's, reported as such
            return ms.runner.RunnerResult(None, error_msg="RPCRunner: An exception occurred\n" + str(outcome))
        costs, server = outcome
        self.served[server] += 1
        return ms.runner.RunnerResult(costs, None)


class Measurement(NamedTuple):
    """How a runner worker measures a candidate on a server (pickled to it)."""

    rpc_config: Any
    evaluator_config: Any
    calibrate: bool
    alloc_repeat: int = 1


def measure_on_server(
    measurement: Measurement, artifact_path: str, device_type: str, args_info: list[Any]
) -> tuple[list[float], str]:
    """One candidate on a server of the key, in a runner worker process: a session from the tracker, the
    module uploaded, its arguments filled, its runs timed; its times, and the server's name."""
    session, remote_path = None, None
    try:
        session = measurement.rpc_config.connect_server()
        server = server_name(session)
        device = session.device(device_type, 0)
        _, remote_path = os.path.split(artifact_path)
        rt_mod = ms.runner.rpc_runner.default_upload_module(session, artifact_path, remote_path)
        repeated = alloc_remote_measure_arguments(session, device, args_info, measurement.alloc_repeat)
        evaluate = (
            run_remote_calibrated_evaluator
            if measurement.calibrate
            else ms.runner.rpc_runner.default_run_evaluator
        )
        return [
            float(c) for c in evaluate(session, rt_mod, device, measurement.evaluator_config, repeated)
        ], server
    finally:
        ms.runner.rpc_runner.default_cleanup(session, remote_path)


def alloc_remote_measure_arguments(
    session: Any, device: Any, args_info: list[Any], alloc_repeat: int
) -> list[list[Any]]:
    """A candidate's arguments on an RPC device: floats random (the server's filler), integers zero, as
    on this machine (:func:`tuner.metaschedule.runner.measure_filler`)."""
    random_fill = ms.utils.get_global_func_on_rpc_session(
        session,
        "tvm.contrib.random.random_fill_for_measure",
        "the RPC server's TVM lacks 'tvm.contrib.random' (built without USE_RANDOM)",
    )
    return ms.runner.utils.alloc_argument_common(measure_filler(random_fill), device, args_info, alloc_repeat)


def run_remote_calibrated_evaluator(
    _session: Any, rt_mod: Any, device: Any, evaluator_config: Any, repeated_args: list[list[Any]]
) -> list[float]:
    """:func:`tuner.metaschedule.runner.run_calibrated_evaluator` on an RPC device's module."""
    return run_calibrated_evaluator(rt_mod, device, evaluator_config, repeated_args)


def make_rpc_runner(
    runner: RunnerSpec, evaluator_config: Any, calibrate: bool = True, servers: int = 1
) -> Any:
    """A MetaSchedule runner measuring on the servers behind ``runner``'s tracker, up to ``servers`` of them
    at once (:class:`GuardedRPCRunner`), with every wait bounded by the runner's timeouts (or the
    defaults). Arguments are filled and candidates timed as on this machine: integers zero, runs per
    repeat calibrated unless ``calibrate`` is off."""
    if runner.is_local:
        raise InvalidSpec("make_rpc_runner needs an rpc runner spec")
    if servers < 1:
        raise InvalidSpec(f"a job measures on at least one server at a time, not {servers}")
    host, port = parse_tracker(runner.tracker)
    session_timeout = runner.session_timeout_s or DEFAULT_SESSION_TIMEOUT_S
    queue_timeout = runner.queue_timeout_s or DEFAULT_QUEUE_TIMEOUT_S
    check_timeout = runner.timeout_s or DEFAULT_CHECK_TIMEOUT_S
    config = ms.runner.RPCConfig(
        tracker_host=host,
        tracker_port=port,
        tracker_key=runner.key,
        session_timeout_sec=session_timeout,
    )
    # A request for a key whose servers are all gone or busy waits at the tracker forever: bound each
    # candidate by the session plus a wait for a free server. A timed-out candidate becomes "RPCRunner:
    # Timeout" and its worker process is replaced.
    workers = DeadlineWorkers(servers, timeout_s=session_timeout + queue_timeout)
    measurement = Measurement(config, evaluator_config, calibrate)
    return GuardedRPCRunner(workers, measurement, runner, check_timeout_s=check_timeout)
