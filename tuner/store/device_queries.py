"""Which RPC servers each job measured on (:class:`~tuner.entities.ServerUse`): what the devices page
shows as the jobs using each server of a key."""

from __future__ import annotations

from collections.abc import Mapping

import sqlalchemy as sa

from tuner.entities import JobStatus, ServerUse
from tuner.errors import Conflict
from tuner.store.base import StoreBase
from tuner.store.orm import JobRow, ServerUseRow, utcnow


class DeviceQueries(StoreBase):
    """Server uses, per job and server."""

    def note_server_use(self, job_id: str, key: str, measured: Mapping[str, int]) -> None:
        """Add a measured batch's candidates per server (``host:port``) of device ``key`` to a job's."""
        if not measured:
            return
        try:
            self._add_server_use(job_id, key, measured)
        except Conflict:  # another worker of the job added the same server first: add to its row
            self._add_server_use(job_id, key, measured)

    def _add_server_use(self, job_id: str, key: str, measured: Mapping[str, int]) -> None:
        now = utcnow()
        with self.session_scope() as s:
            self._job_row(s, job_id)
            rows = {
                row.server: row
                for row in s.scalars(
                    sa.select(ServerUseRow).where(
                        ServerUseRow.job_id == job_id, ServerUseRow.server.in_(list(measured))
                    )
                )
            }
            for server, candidates in measured.items():
                row = rows.get(server)
                if row is None:
                    s.add(
                        ServerUseRow(
                            job_id=job_id,
                            key=key,
                            server=server,
                            candidates=candidates,
                            first_used_at=now,
                            last_used_at=now,
                        )
                    )
                else:
                    row.candidates += candidates
                    row.last_used_at = now

    def server_uses(self, *, running_only: bool = False, job_id: str | None = None) -> list[ServerUse]:
        """Server uses, the latest first: of running jobs only, or of one job, or all."""
        query = sa.select(ServerUseRow, JobRow.owner, JobRow.status).join(
            JobRow, JobRow.id == ServerUseRow.job_id
        )
        if running_only:
            query = query.where(JobRow.status == JobStatus.RUNNING.value)
        if job_id is not None:
            query = query.where(ServerUseRow.job_id == job_id)
        query = query.order_by(ServerUseRow.last_used_at.desc(), ServerUseRow.id)
        with self.session_scope(write=False) as s:
            return [
                ServerUse(
                    key=row.key,
                    server=row.server,
                    job_id=row.job_id,
                    owner=owner,
                    job_status=JobStatus(status),
                    candidates=row.candidates,
                    first_used_at=row.first_used_at,
                    last_used_at=row.last_used_at,
                )
                for row, owner, status in s.execute(query)
            ]
