"""MetaSchedule's ``RPCRunner`` with every wait bounded, failing at once when the device goes away."""

from __future__ import annotations

from typing import Any

from kiln_tvm import PopenPoolExecutor, derived_object, ms
from tuner.entities import RunnerSpec
from tuner.errors import InvalidSpec
from tuner.metaschedule.runner import DoneFuture, measure_filler, run_calibrated_evaluator
from tuner.rpc.tracker import (
    DEFAULT_CHECK_TIMEOUT_S,
    DEFAULT_QUEUE_TIMEOUT_S,
    DEFAULT_SESSION_TIMEOUT_S,
    check_runner,
    parse_tracker,
)


@derived_object
class GuardedRPCRunner(ms.runner.PyRunner):
    """MetaSchedule's ``RPCRunner``, measuring one candidate at a time and failing when the device goes.

    Before each batch, and after each failed candidate, it asks the tracker whether a server with the
    key is still registered: a job whose device disappeared fails with ``DeviceUnavailable`` at once
    instead of timing out candidate after candidate. Waiting for each measurement also keeps the
    search's threads off the CPU while a server on this machine measures.
    """

    def __init__(self, inner: Any, runner: RunnerSpec, check_timeout_s: float) -> None:
        super().__init__()
        self.inner = inner
        self.runner = runner
        self.check_timeout_s = check_timeout_s

    def run(self, runner_inputs: list[Any]) -> list[Any]:
        check_runner(self.runner, self.check_timeout_s)
        futures = []
        for runner_input in runner_inputs:
            result = self.inner.run([runner_input])[0].result()
            if result.error_msg:
                check_runner(self.runner, self.check_timeout_s)
            futures.append(DoneFuture(result))
        return futures


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


def make_rpc_runner(runner: RunnerSpec, evaluator_config: Any, calibrate: bool = True) -> Any:
    """A MetaSchedule runner measuring on the servers behind ``runner``'s tracker, with every wait
    bounded by the runner's timeouts (or the defaults). Arguments are filled and candidates timed as on
    this machine: integers zero, runs per repeat calibrated unless ``calibrate`` is off."""
    if runner.is_local:
        raise InvalidSpec("make_rpc_runner needs an rpc runner spec")
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
    inner = ms.runner.RPCRunner(
        rpc_config=config,
        evaluator_config=evaluator_config,
        max_workers=1,
        f_alloc_argument=alloc_remote_measure_arguments,
        f_run_evaluator=run_remote_calibrated_evaluator if calibrate else None,
    )
    # The stock pool has no timeout, and a request for a key whose servers are all gone or busy waits
    # at the tracker forever: bound each candidate by the session plus a wait for a free server. A
    # timed-out candidate becomes "RPCRunner: Timeout" and its worker process is replaced.
    inner.pool.shutdown()
    inner.pool = PopenPoolExecutor(max_workers=1, timeout=session_timeout + queue_timeout)
    return GuardedRPCRunner(inner, runner, check_timeout)
