"""How much a search may spend: trials, seconds, a cap per task, and its seed."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.errors import InvalidSpec


@dataclass(frozen=True)
class Budget:
    """How much to tune: total trials, seconds of tuning, or both (whichever ends first); an optional
    per-task cap, and the search seed. ``trials=None`` sets no trial limit (then ``time_s`` is needed)."""

    trials: int | None
    max_trials_per_task: int | None = None
    seed: int = 0
    time_s: float | None = None

    def __post_init__(self) -> None:
        for name, value in (("trials", self.trials), ("seed", self.seed)):
            if value is not None and type(value) is not int:
                raise InvalidSpec(f"{name} must be an integer, got {value!r}")
        if self.max_trials_per_task is not None and type(self.max_trials_per_task) is not int:
            raise InvalidSpec(f"max trials per task must be an integer, got {self.max_trials_per_task!r}")
        if self.trials is not None and self.trials < 0:
            raise InvalidSpec(f"trials must be >= 0, got {self.trials}")
        if self.max_trials_per_task is not None and self.max_trials_per_task < 1:
            raise InvalidSpec(f"max trials per task must be >= 1, got {self.max_trials_per_task}")
        if self.time_s is not None and (
            type(self.time_s) not in (int, float) or not math.isfinite(self.time_s) or self.time_s <= 0
        ):
            raise InvalidSpec(f"the time budget must be a positive number of seconds, got {self.time_s!r}")
        if self.trials is None and self.time_s is None:
            raise InvalidSpec("give a number of trials, a time budget, or both")
