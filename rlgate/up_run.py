"""`rlgate up`, the command: migrate, keep the keys, check the ports, start the stack
(rlgate/up.py), then print what a newcomer needs (rlgate/up_snippets.py) and write the
client configurations (rlgate/up_clients.py); Ctrl-C stops everything."""

from __future__ import annotations

import os
import secrets
import signal
import time
from pathlib import Path
from typing import Any

import click
import httpx

from core.settings import Settings
from rlgate.stack import StackInfo
from rlgate.stack import remove as remove_stack
from rlgate.stack import write as write_stack
from rlgate.up import Shape, _default_cap, check_ports, check_shape, launch


def _more_gateways(bases: list[str]) -> str:
    """The other gateways' base URLs (they serve the same API, keys and data)."""
    if len(bases) < 2:
        return ""
    return f"  other gateways:        {', '.join(b + '/v1' for b in bases[1:])}\n"


def served_context(base: str, agent_key: str) -> int | None:
    """The context length the gateway reports on /v1/models (None when it cannot say)."""
    try:
        r = httpx.get(
            f"{base}/v1/models", headers={"Authorization": f"Bearer {agent_key}"}, timeout=30
        )
        r.raise_for_status()
        return int(r.json()["data"][0]["context_length"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None


def _training(settings: Settings, factory: Any, data_dir: Path, rlgate: str) -> str:
    """The printed training trigger of the default project (its own settings)."""
    from rlgate.up_snippets import training_note
    from trainer.config import TrainConfigError
    from trainer.serving_switch import project_config

    project = settings.default_project
    try:
        with factory() as db:
            cfg = project_config(db, project)[1]
    except (LookupError, TrainConfigError) as e:
        return f"  training:              cannot tell: {e}\n"
    return training_note(cfg, rlgate, project, data_dir)


def run_up(
    settings: Settings,
    port: int,
    engine_port: int,
    trainer: bool,
    shape: Shape | None = None,
    new_keys: bool = False,
) -> None:
    from core import migrate as mig
    from core.db import make_engine, session_factory, transaction
    from rlgate.up_clients import write_client_files
    from rlgate.up_keys import keys_path, up_keys
    from rlgate.up_node import node_note
    from rlgate.up_snippets import rlgate_path, snippets

    shape = shape or Shape()
    check_shape(settings, port, engine_port, shape)  # before anything is written
    check_ports(settings, port, engine_port, shape)  # or started
    data_dir = settings.data_dir.resolve()
    url = settings.effective_database_url
    click.echo(f"rlgate up: data in {data_dir}", err=True)
    mig.upgrade(url)
    factory = session_factory(make_engine(url))
    with transaction(factory) as db:
        keys = up_keys(db, data_dir, settings.default_project, new=new_keys)
    kept = "kept from" if keys.reused else "new, kept in"
    rlgate = rlgate_path()

    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    engine_key = settings.engine_api_key_value or secrets.token_urlsafe(32)
    stack = launch(
        settings,
        port,
        engine_port,
        trainer,
        extra_env={"RLGATE_ENGINE_API_KEY": engine_key},
        shape=shape,
    )
    stack_file = write_stack(
        StackInfo(
            data_dir=str(data_dir),
            database_url=_absolute_url(url),
            engine_urls=",".join(stack.engine_urls),
            engine_api_key=engine_key,
            gateway_url=stack.base,
            admin_key_file=str(keys_path(data_dir)),
            default_max_tokens=_default_cap(settings).get("RLGATE_DEFAULT_MAX_TOKENS", ""),
            pid=os.getpid(),
        )
    )
    try:
        model = settings.served_model_name
        context = served_context(stack.base, keys.agent)
        files = write_client_files(data_dir, stack.base, keys.agent, context)
        training = _training(settings, factory, data_dir, rlgate) if trainer else ""
        click.echo(f"""
rlgate is up.
  base_url (OpenAI):     {stack.base}/v1
  base_url (Anthropic):  {stack.base}
  agent key:             {keys.agent}
  admin key:             {keys.admin}
  keys:                  {kept} {keys_path(data_dir)} (`rlgate up --new-keys` replaces them)
  admin dashboard:       {stack.base}/admin   (log in with the admin key)
{_more_gateways(stack.bases)}  engine(s):             {", ".join(stack.engine_urls)}
  model:                 {model} ({context or "unknown"}-token context)
  {stack.trainer_note}
{training}  rlgate command:        {rlgate}
  logs:                  {stack.logs}
{snippets(stack.base, keys.agent, model, files)}
Press Ctrl-C to stop.""")
        note = node_note()
        if note:
            click.echo(note, err=True)
        while not stopping:
            stack.check_alive()
            time.sleep(0.5)
        click.echo("\nstopping ...", err=True)
    finally:
        stack.stop()
        remove_stack(stack_file)
    click.echo("stopped.", err=True)


def _absolute_url(url: str) -> str:
    """A SQLite URL with an absolute path: the stack file is read from other directories."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url[len(prefix) :].startswith("/"):
        return prefix + str(Path(url[len(prefix) :]).resolve())
    return url
