"""Who may rate, and as what (docs/security.md, "Ratings").

- An HTTP client (``POST /feedback``) rates as a user: ``source`` is ``user``. Every other
  source (``verifier``, ``judge``, ``system``, ``next_turn`` and any later one) is the
  system's, written by rlgate's own code (the worker; AReaL's ``/rl/set_reward`` route
  writes ``system``), never named by a client.
- A client's idempotency keys are stored under :data:`CLIENT_KEY_PREFIX`, a namespace of
  their own: whatever a client sends, it cannot name (so cannot pre-empt) a key the worker
  writes, such as ``verifier:<name>:<session>``. The worker's keys never start with it.
- A project may refuse ratings from its agent keys (:data:`AGENT_KEYS_RATE`, default
  true): then only its feedback keys and admin keys rate.
"""

from __future__ import annotations

from typing import Any

from schemas.atdp import FeedbackSource

CLIENT_SOURCE = FeedbackSource.user.value
CLIENT_KEY_PREFIX = "client:"
AGENT_KEYS_RATE = "agent_keys_rate"  # Project.settings key: bool, default True


def system_source(source: str) -> bool:
    """Whether only rlgate's own code may write ratings of this source (all but user)."""
    return source != CLIENT_SOURCE


def client_key(key: str | None) -> str | None:
    """A client's idempotency key, as stored: in the clients' own namespace."""
    return None if key is None else CLIENT_KEY_PREFIX + key


def shown_key(stored: str | None) -> str | None:
    """The idempotency key as its writer sent it (a client's, without the namespace)."""
    if stored is not None and stored.startswith(CLIENT_KEY_PREFIX):
        return stored[len(CLIENT_KEY_PREFIX) :]
    return stored


def check_system_key(source: str, key: str | None) -> None:
    """The worker's keys stay out of the clients' namespace (a programming error if not)."""
    if system_source(source) and key is not None and key.startswith(CLIENT_KEY_PREFIX):
        raise ValueError(f"a {source} rating's idempotency key may not start {CLIENT_KEY_PREFIX}")


def agent_keys_rate(settings: dict[str, Any]) -> bool:
    """Whether the project's agent keys may rate (``settings["agent_keys_rate"]``)."""
    return settings.get(AGENT_KEYS_RATE, True) is not False
