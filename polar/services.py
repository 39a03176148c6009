"""What a stage function needs from its process: configuration, the database, a dispatcher, its own name.

Stage messages are sent through ``polar.lifecycle.outbox``, which records them as due before the dispatcher
sends them."""

from __future__ import annotations

from dataclasses import dataclass, field

from polar.config import Config
from polar.contract.dispatch import Dispatcher
from polar.records.provenance import EngineProbe
from polar.storage.database import Database


@dataclass(frozen=True)
class Services:
    config: Config
    db: Database
    dispatcher: Dispatcher
    worker: str
    # The engines' models and versions a submission records (polar.records.provenance), kept per process.
    engine_probe: EngineProbe = field(default_factory=EngineProbe, compare=False)
