"""Storage: the SQLAlchemy models (``models``), their column types (``columns``), connections (``database``)
and schema migration (``migration``)."""

from polar.storage.database import Database, create_db_engine
from polar.storage.models import Base, Batch, ModelCall, Session, SessionEvent, Task, Trajectory

__all__ = [
    "Base",
    "Batch",
    "Database",
    "ModelCall",
    "Session",
    "SessionEvent",
    "Task",
    "Trajectory",
    "create_db_engine",
]
