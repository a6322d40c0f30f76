"""MetaSchedule's ``RPCRunner`` with every wait bounded, failing at once when the device goes away."""

from __future__ import annotations

from typing import Any

from kiln_tvm import PopenPoolExecutor, derived_object, ms
from tuner.errors import InvalidSpec
from tuner.metaschedule.runner import DoneFuture
from tuner.rpc.tracker import (
    DEFAULT_CHECK_TIMEOUT_S,
    DEFAULT_QUEUE_TIMEOUT_S,
    DEFAULT_SESSION_TIMEOUT_S,
    check_runner,
    parse_tracker,
    validate_runner,
)


@derived_object
class GuardedRPCRunner(ms.runner.PyRunner):
    """MetaSchedule's ``RPCRunner``, measuring one candidate at a time and failing when the device goes.

    Before each batch, and after each failed candidate, it asks the tracker whether a server with the
    key is still registered: a job whose device disappeared fails with ``DeviceUnavailable`` at once
    instead of timing out candidate after candidate. Waiting for each measurement also keeps the
    search's threads off the CPU while a server on this machine measures.
    """

    def __init__(self, inner: Any, runner: dict[str, Any], check_timeout_s: float) -> None:
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


def make_rpc_runner(runner: dict[str, Any], evaluator_config: Any) -> Any:
    """A MetaSchedule runner measuring on the servers behind a tracker, with every wait bounded.

    Optional runner fields: ``session_timeout_s`` (one candidate's session on the server, default 60),
    ``queue_timeout_s`` (waiting for a busy server, default 60), ``timeout_s`` (a question to the
    tracker, default 10).
    """
    fields = validate_runner(runner)
    if fields is None:
        raise InvalidSpec("make_rpc_runner needs an rpc runner spec")
    tracker, key = fields
    host, port = parse_tracker(tracker)
    session_timeout = int(runner.get("session_timeout_s", DEFAULT_SESSION_TIMEOUT_S))
    queue_timeout = float(runner.get("queue_timeout_s", DEFAULT_QUEUE_TIMEOUT_S))
    check_timeout = float(runner.get("timeout_s", DEFAULT_CHECK_TIMEOUT_S))
    if session_timeout < 1 or queue_timeout <= 0 or check_timeout <= 0:
        raise InvalidSpec("rpc runner timeouts must be positive")
    config = ms.runner.RPCConfig(
        tracker_host=host,
        tracker_port=port,
        tracker_key=key,
        session_timeout_sec=session_timeout,
    )
    inner = ms.runner.RPCRunner(rpc_config=config, evaluator_config=evaluator_config, max_workers=1)
    # The stock pool has no timeout, and a request for a key whose servers are all gone or busy waits
    # at the tracker forever: bound each candidate by the session plus a wait for a free server. A
    # timed-out candidate becomes "RPCRunner: Timeout" and its worker process is replaced.
    inner.pool.shutdown()
    inner.pool = PopenPoolExecutor(max_workers=1, timeout=session_timeout + queue_timeout)
    return GuardedRPCRunner(inner, {"kind": "rpc", "tracker": tracker, "key": key}, check_timeout)
