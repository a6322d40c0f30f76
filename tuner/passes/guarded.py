"""Kiln's graph passes, guarded: a pass that fails leaves the program as it was given, and says why.

Every graph pass Kiln runs before legalization is an optimisation: layout conversion, the precision
policy, quantization lowering, fast math, weight packing, constant folding. None of them is needed for
the model to compile, since plain ``tvm.compile`` legalizes the imported program without them. So a pass
that raises on some operator (TVM's layout rules crash on several) must not fail the job: the
:func:`guarded` pass returns its input unchanged, puts the reports it was filling back as they were, and
adds a line to :class:`SkippedPasses`, which the plan's fusion summary shows.

A pass that returns a program TVM's checker finds ill-formed (``DecomposeOpsForInference`` can call a
shape function it did not add) has failed too.

Kiln's own typed errors (a limit reached while planning) and running out of memory are not a pass's
failure on an operator: they propagate.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import Any

from kiln_tvm import relax, tvm
from tuner.errors import KilnError
from tuner.frontend.imported import short_error

log = logging.getLogger(__name__)


@dataclass
class SkippedPasses:
    """What the guarded passes of one plan left out: one line each, ``"<what>: <why>"``."""

    notes: list[str] = field(default_factory=list)

    def add(self, note: str) -> None:
        """Keep a line (once: a pass run on several functions may fail the same way twice)."""
        if note not in self.notes:
            log.warning("graph pass left out: %s", note)
            self.notes.append(note)


def guarded(
    inner: tvm.transform.Pass, skipped: SkippedPasses, what: str, reports: tuple[Any, ...] = ()
) -> tvm.transform.Pass:
    """``inner``, under the same name (so the recorded levels read the same), returning its input when
    it fails; ``what`` names it in the note (``"layout conversion to NHWC"``); ``reports`` are the
    dataclasses ``inner`` fills, restored to their state before it ran when it fails."""

    @tvm.transform.module_pass(opt_level=0, name=str(inner.info.name))
    def run(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        saved = [copy.deepcopy(vars(report)) for report in reports]
        try:
            out = inner(mod)
            if not relax.analysis.check_well_formed(out) and relax.analysis.check_well_formed(mod):
                raise ValueError("it left a program that is not well formed")
            return out
        except (KilnError, MemoryError):
            raise
        except Exception as err:  # noqa: BLE001 - TVM raises InternalError, TypeError, ValueError...
            for report, state in zip(reports, saved, strict=True):
                vars(report).clear()
                vars(report).update(state)
            skipped.add(f"{what} skipped: {short_error(err, limit=300)}")
            return mod

    return run
