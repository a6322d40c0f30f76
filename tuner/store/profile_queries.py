"""A job's profile of its compiled model, and each host's measured roofs (cached: measured once)."""

from __future__ import annotations

import dataclasses
import json
import zlib

import sqlalchemy as sa

from tuner.entities import MachineLimits, ModelProfile
from tuner.errors import NotFound
from tuner.store.base import StoreBase
from tuner.store.orm import JobProfileRow, MachineLimitsRow, utcnow

_LIMIT_COLUMNS = ("host", "measured_at")


class ProfileQueries(StoreBase):
    """Job profiles and machine limits."""

    def set_job_profile(self, job_id: str, profile: ModelProfile) -> None:
        """Keep a job's profile, replacing any an earlier attempt of it kept."""
        blob = zlib.compress(json.dumps(profile.as_dict()).encode(), 6)
        with self.session_scope() as s:
            self._job_row(s, job_id)
            s.execute(sa.delete(JobProfileRow).where(JobProfileRow.job_id == job_id))
            s.add(JobProfileRow(job_id=job_id, profile_zlib=blob))

    def get_job_profile(self, job_id: str) -> ModelProfile:
        """A job's profile; :class:`NotFound` when it has none (yet)."""
        with self.session_scope(write=False) as s:
            self._job_row(s, job_id)
            blob = s.scalar(sa.select(JobProfileRow.profile_zlib).where(JobProfileRow.job_id == job_id))
        if blob is None:
            raise NotFound(
                f"job '{job_id}' has no profile: a job profiles its compiled model when it measures it, "
                "on the machine that runs it (a host CPU target), once it has compiled"
            )
        return ModelProfile.from_dict(json.loads(zlib.decompress(blob)))

    def get_machine_limits(self, host: str) -> MachineLimits | None:
        """The roofs measured on ``host`` (a host name and target key), or None when never measured."""
        with self.session_scope(write=False) as s:
            row = s.scalar(sa.select(MachineLimitsRow).where(MachineLimitsRow.host == host))
            if row is None:
                return None
            return MachineLimits(**json.loads(row.limits_json), host=row.host, measured_at=row.measured_at)

    def save_machine_limits(self, host: str, limits: MachineLimits) -> MachineLimits:
        """Keep ``limits`` as ``host``'s, replacing what was measured there before."""
        values = {k: v for k, v in dataclasses.asdict(limits).items() if k not in _LIMIT_COLUMNS}
        now = utcnow()
        with self.session_scope() as s:
            row = s.scalar(sa.select(MachineLimitsRow).where(MachineLimitsRow.host == host))
            if row is None:
                s.add(MachineLimitsRow(host=host, limits_json=json.dumps(values), measured_at=now))
            else:
                row.limits_json = json.dumps(values)
                row.measured_at = now
        return dataclasses.replace(limits, host=host, measured_at=now)
