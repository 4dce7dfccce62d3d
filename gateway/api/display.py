"""A stored request's conversation for the dashboard, read by the translator of the API
that took it (the interaction id's prefix names it, ``registry.APIS``)."""

from __future__ import annotations

from typing import Any

from gateway.api.registry import APIS, DEFAULT


def request_messages(request: dict[str, Any], interaction_id: str = "") -> list[dict[str, Any]]:
    """The messages of ``request`` as role / text / tool calls. A record whose id names no
    API (written by other tools) is read by its shape (an API's ``shaped``), else as
    the default API's."""
    for api in APIS:
        if api.took(interaction_id):
            return api.display(request)
    for api in APIS:
        if api.shaped is not None and api.shaped(request):
            return api.display(request)
    return DEFAULT.display(request)
