"""Typed errors of Kiln's core. Each carries a message a user can act on.

The web layer maps these classes to HTTP status codes in one place (``service/errors.py``); the CLI
prints the message and exits non-zero.
"""

from __future__ import annotations


class KilnError(Exception):
    """Root of every error Kiln raises on purpose."""

    kind: str = "kiln_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def details(self) -> dict[str, object]:
        """What the error carries beside its message (e.g. the operators), to send it across processes."""
        return {k: v for k, v in vars(self).items() if k != "message"}


class InvalidModel(KilnError):
    """The uploaded file is not a model Kiln can read (corrupt, truncated, wrong format)."""

    kind = "invalid_model"


class ImporterCrashed(InvalidModel):
    """The process importing a model died (a signal, an exit) instead of answering."""

    kind = "importer_crashed"


class UnsupportedOperator(KilnError):
    """The model uses operators the importer cannot convert; lists all of them."""

    kind = "unsupported_operator"

    def __init__(self, operators: list[str], importer: str, reason: str = "") -> None:
        """``reason`` follows the list in the message as written (with its own leading punctuation)."""
        self.operators = sorted(set(operators))
        names = ", ".join(f"'{op}'" for op in self.operators)
        noun = "operator" if len(self.operators) == 1 else "operators"
        verb = "is" if len(self.operators) == 1 else "are"
        super().__init__(f"{noun} {names} {verb} not supported by the {importer} importer{reason}")


class MissingInputShape(KilnError):
    """An input has a dynamic dimension and no shape was given for it."""

    kind = "missing_input_shape"


class InvalidSpec(KilnError):
    """A request is malformed: a bad target, a negative budget, an unknown input name..."""

    kind = "invalid_spec"


class InvalidCalibration(InvalidSpec):
    """A calibration file is not inputs of its model: not an .npz, unknown or missing input names, wrong
    shapes or dtypes, too few samples, too large."""

    kind = "invalid_calibration"


class InvalidTarget(InvalidSpec):
    """The target cannot be parsed or is not supported."""

    kind = "invalid_target"


class MissingDependency(KilnError):
    """An optional dependency (e.g. the ``torch`` extra) is needed but not installed."""

    kind = "missing_dependency"


class NotFound(KilnError):
    """A model, job, task or artifact does not exist."""

    kind = "not_found"


class Conflict(KilnError):
    """The request conflicts with the current state (e.g. an artifact of an unfinished job)."""

    kind = "conflict"


class SchemaOutdated(KilnError):
    """The database schema is older than this version of Kiln."""

    kind = "schema_outdated"


class TuningFailed(KilnError):
    """Tuning, compilation or verification of a job failed."""

    kind = "tuning_failed"


class VerificationFailed(TuningFailed):
    """The tuned build's outputs do not match the reference within tolerance."""

    kind = "verification_failed"


class DeviceUnavailable(KilnError):
    """A measurement device cannot be reached: the RPC tracker is down, or no server has the key."""

    kind = "device_unavailable"


class Unauthorized(KilnError):
    """The request carries no valid API token while the service requires one."""

    kind = "unauthorized"


class PayloadTooLarge(KilnError):
    """An upload is larger than the service accepts (``KILN_MAX_UPLOAD_MB``)."""

    kind = "payload_too_large"


class ModelTooLarge(KilnError):
    """Importing or planning a model needs more memory (or unpacks to more bytes) than the limits allow."""

    kind = "model_too_large"


class TooManyRequests(KilnError):
    """A user holds as many of a bounded resource (open event streams) as the service allows."""

    kind = "too_many_requests"


class ImportTimeout(KilnError):
    """Importing or planning a model took longer than its wall-clock or CPU-time limit."""

    kind = "import_timeout"
    machine_busy = False

    def __init__(self, message: str, machine_busy: bool = False) -> None:
        super().__init__(message)
        #: the importer waited for the CPU more than it worked: the limit may not be hit again
        self.machine_busy = machine_busy


def rebuild_error(kind: str, message: str, details: dict[str, object] | None = None) -> KilnError:
    """The typed error of ``kind`` with ``message`` and :meth:`KilnError.details` (errors cross process
    boundaries as these three)."""
    classes: list[type[KilnError]] = [KilnError]
    for cls in classes:
        classes.extend(cls.__subclasses__())
        if cls.kind == kind:
            error = cls.__new__(cls)
            KilnError.__init__(error, message)
            for key, value in (details or {}).items():
                setattr(error, key, value)
            return error
    return InvalidModel(message)
