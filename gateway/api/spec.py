"""What an API package registers with the gateway (its ``spec.py`` exports ``API``, and
``registry.py`` lists them): the one place its routes, paths, error format, rate-limited
model calls, dashboard translator and protocol name are named. gateway/app.py mounts the
routers, gateway/edge/errors.py and gateway/edge/ratelimit.py read the specs from
``app.state.apis``, and ``display.py`` reads a stored request with the translator of the
API that took it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from fastapi import APIRouter

from gateway.edge.credentials import CredentialReader
from gateway.edge.errors import ErrorFormat
from schemas.atdp import ClientProtocol

Display = Callable[[dict[str, Any]], list[dict[str, Any]]]


@dataclass(frozen=True)
class ApiSpec:
    protocol: ClientProtocol  # what its interactions record as ``protocol``
    id_prefix: str  # its interaction ids' prefix (``chatcmpl-``, ``msg_``, ...)
    router: APIRouter
    # POST paths of model calls (a concurrency slot each); ``{name}`` stands for one path
    # segment, for an API that names the model in its path
    model_paths: frozenset[str]
    display: Display  # a stored request's messages, as the dashboard shows them
    errors: ErrorFormat | None = None  # None: the gateway's own (OpenAI's)
    error_header: str | None = None  # a header that asks for its error format on any path
    # a stored request of this API recognised by its shape (records written by other tools,
    # whose ids name no API); None: not recognisable
    shaped: Callable[[dict[str, Any]], bool] | None = None
    # where this API's clients send their key besides ``Authorization: Bearer`` and
    # ``x-api-key`` (a header or query parameter of its own), read for requests under its
    # paths; a key found there must be the same as any other presented (else a 400)
    credential: CredentialReader | None = None

    @property
    def paths(self) -> tuple[str, ...]:
        """The paths its router answers (a request under one gets its error format)."""
        return tuple(dict.fromkeys(r.path.split("{", 1)[0].rstrip("/") for r in self.router.routes))

    @classmethod
    def of(
        cls, translator: ModuleType, router: APIRouter, model_paths: Iterable[str], **more: Any
    ) -> ApiSpec:
        """An API's spec from its translator module (its ``PROTOCOL``, ``ID_PREFIX`` and
        ``display_messages``), its router and the paths of its model calls."""
        return cls(
            protocol=translator.PROTOCOL,
            id_prefix=translator.ID_PREFIX,
            router=router,
            model_paths=frozenset(model_paths),
            display=translator.display_messages,
            **more,
        )

    def took(self, interaction_id: str) -> bool:
        return interaction_id.startswith(self.id_prefix)
