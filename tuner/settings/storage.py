"""Where Kiln keeps its files and its database."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field


class StorageSettings(BaseModel):
    """Where Kiln keeps its files and its database."""

    data_dir: Path = Field(default=Path("kiln-data"), description="Where models, artifacts and SQLite live")
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default: SQLite file kiln.db in data_dir"
    )

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'kiln.db').resolve()}"

    @property
    def blob_dir(self) -> Path:
        return self.data_dir / "models"

    @property
    def calibration_dir(self) -> Path:
        """Where calibration files are kept, each by its sha256."""
        return self.data_dir / "calibration"

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir / "jobs"
