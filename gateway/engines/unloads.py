"""Unloading a replaced version in the background (``Unloads``).

A rollback or promote from the dashboard or the admin API answers as soon as new requests
go to the new version (trainer/serving_switch.py ``serve_version(unload=False)``: the
pointer switched, every gateway's cached pointer dropped, the replaced version's live
directory removed). The replaced version is then unloaded here, on the gateway's event
loop: first wait until no request of this gateway holds it (gateway/engines/adapter_leases.py),
at most ``RLGATE_UNLOAD_WAIT_S``; then unload it from every engine (each engine also
waits for the requests other gateways sent it), unless it was served again meanwhile.
Each unload writes an AuditEvent
``adapter.unload`` (``waited_s``, ``forced``: the wait ran out and requests were still
on it, ``in_flight``: how many, ``failed``: engines that did not unload it; the adapter
sync retries those). ``GET /admin/api/unloads`` and the adapters page show what each
pending unload still waits for.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from core.db import transaction
from core.keys import audit
from core.serving_version import adapters_in_service
from gateway.engines.adapter_leases import Leases
from gateway.engines.adapter_sync import AdapterSync
from schemas.coltypes import utcnow
from schemas.tables import PolicyVersionRow

log = logging.getLogger("rlgate.gateway")

WAITING, UNLOADING = "waiting", "unloading"


@dataclass
class Unload:
    project_id: str
    name: str
    actor: str
    wait_s: float
    since: datetime = field(default_factory=utcnow)
    started: float = field(default_factory=time.monotonic)
    state: str = WAITING


class Unloads:
    """The background unloads of this gateway, by adapter name."""

    def __init__(
        self,
        leases: Leases,
        sync: AdapterSync,
        factory: sessionmaker[Session],
        wait_s: float = 600.0,
    ) -> None:
        self.leases = leases
        self.sync = sync
        self.factory = factory
        self.wait_s = wait_s
        self._pending: dict[str, Unload] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, project_id: str, name: str, actor: str) -> dict[str, Any]:
        """Unload ``name`` once its requests here are done (on the running event loop);
        returns what :meth:`pending` shows for it."""
        u = self._pending.get(name)
        if u is None:
            u = self._pending[name] = Unload(project_id, name, actor, self.wait_s)
            task = asyncio.create_task(self._run(u), name=f"unload-{name}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return self._view(u)

    def _view(self, u: Unload) -> dict[str, Any]:
        waited = time.monotonic() - u.started
        return {
            "project_id": u.project_id,
            "name": u.name,
            "state": u.state,
            "in_flight": self.leases.count(u.name),
            "since": u.since.isoformat(),
            "waited_s": round(waited, 1),
            "unload_by_s": round(max(0.0, u.wait_s - waited), 1),
        }

    def pending(self, scope: list[str] | None = None) -> list[dict[str, Any]]:
        """The unloads not done yet (of the projects in ``scope``; None: all): each
        version's name, ``state`` (waiting for its requests, or unloading), the requests
        of this gateway still on it (``in_flight``) and the seconds until it is unloaded
        anyway (``unload_by_s``)."""
        return [
            self._view(u) for u in self._pending.values() if scope is None or u.project_id in scope
        ]

    async def _run(self, u: Unload) -> None:
        try:
            released = await self.leases.wait_released(u.name, u.wait_s)
            if not await asyncio.to_thread(self._still_out, u.name):
                log.info("%s serves again (promoted or rolled back to meanwhile): kept", u.name)
                return
            u.state = UNLOADING
            in_flight = self.leases.count(u.name)
            failed = await self.sync.unload_everywhere(u.name)
            waited = round(time.monotonic() - u.started, 1)
            if not released:
                log.warning(
                    "unloading %s with %d requests still on it: they ran past "
                    "RLGATE_UNLOAD_WAIT_S (%g s)",
                    u.name,
                    in_flight,
                    u.wait_s,
                )
            details = {
                "name": u.name,
                "waited_s": waited,
                "forced": not released,
                "in_flight": in_flight,
                "failed": failed,
            }
            await asyncio.to_thread(self._audit, u, details)
        except asyncio.CancelledError:  # the gateway stops: the adapter syncs finish it
            raise
        except Exception:
            log.warning(
                "background unload of %s failed (the adapter sync retries)", u.name, exc_info=True
            )
        finally:
            self._pending.pop(u.name, None)

    def _still_out(self, name: str) -> bool:
        """Whether ``name`` is still out of service (not served again since its switch)."""
        with self.factory() as db:
            return name in adapters_in_service(db)[1]

    def _audit(self, u: Unload, details: dict[str, Any]) -> None:
        with transaction(self.factory) as db:
            vid = db.scalars(
                select(PolicyVersionRow.id).where(
                    PolicyVersionRow.project_id == u.project_id, PolicyVersionRow.name == u.name
                )
            ).first()
            audit(db, u.actor, "adapter.unload", u.project_id, "policy_version", vid, details)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
