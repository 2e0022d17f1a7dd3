"""The service's database: models, engine, migrations, the task queue and the read repository."""

from warmup.db.engine import make_engine, make_sessionmaker
from warmup.db.queue import RetryStrategy, TaskQueue
from warmup.db.records import ClaimedTask, FileRef, Keyed
from warmup.db.repository import Repository

__all__ = [
    "ClaimedTask",
    "FileRef",
    "Keyed",
    "Repository",
    "RetryStrategy",
    "TaskQueue",
    "make_engine",
    "make_sessionmaker",
]
