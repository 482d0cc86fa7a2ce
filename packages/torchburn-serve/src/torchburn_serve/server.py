"""Running the app: uvicorn on one event loop, with its own graceful shutdown (Ctrl-C or SIGTERM stop
taking requests, let the engine finish its step, answer what is left with a 503, and return)."""

from __future__ import annotations

import ipaddress
import logging
import socket

import uvicorn
from torchburn_llm.llm import LLM

from .app import create_app
from .limits import Limits

log = logging.getLogger("torchburn.serve")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(
    llm: LLM,
    model_id: str,
    host: str = "127.0.0.1",
    port: int = 8080,
    api_key: str | None = None,
    limits: Limits | None = None,
    log_level: str = "info",
    sock: socket.socket | None = None,
) -> None:
    """Serve ``llm`` until interrupted. ``sock``: an already bound socket to serve on instead of host/port."""
    if not is_loopback(host) and api_key is None:
        log.warning("serving on %s without --api-key: anyone who can reach this address can use the model", host)
    app = create_app(llm, model_id, limits, api_key)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=5,
        server_header=False,
    )
    server = uvicorn.Server(config)
    server.run(sockets=[sock] if sock is not None else None)
