"""What a stage function needs from its process: configuration, the database, a dispatcher, its own name.

Stage messages are sent through ``polar.lifecycle.outbox``, which records them as due before the dispatcher
sends them."""

from __future__ import annotations

from dataclasses import dataclass

from polar.config import Config
from polar.lifecycle.dispatch import Dispatcher
from polar.storage.database import Database


@dataclass(frozen=True)
class Services:
    config: Config
    db: Database
    dispatcher: Dispatcher
    worker: str
