"""Running the app: uvicorn on one event loop, with its own graceful shutdown (Ctrl-C or SIGTERM stop
taking requests, let the engine finish its step, answer what is left with a 503, and return)."""

from __future__ import annotations

import gc
import ipaddress
import logging
import socket
from collections.abc import Sequence
from types import FrameType

import uvicorn

from torchburn_llm.llm import LLM

from .app import create_app
from .engine import Engine
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
    cors_origins: Sequence[str] = (),
) -> None:
    """Serve ``llm`` until interrupted. ``sock``: an already bound socket to serve on instead of host/port;
    ``cors_origins``: web origins besides loopback ones whose pages may call the API (see ``create_app``)."""
    if not is_loopback(host) and api_key is None:
        log.warning("serving on %s without --api-key: anyone who can reach this address can use the model", host)
    app = create_app(llm, model_id, limits, api_key, cors_origins)
    # The model, tokenizer and app are a few hundred thousand objects that live as long as the process;
    # a full collection walks them all (tens of milliseconds, every stream stalled). Set them aside.
    gc.collect()
    gc.freeze()
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=5,
        server_header=False,
    )
    server = _Server(config, app.state.server.engine)
    server.run(sockets=[sock] if sock is not None else None)


class _Server(uvicorn.Server):
    """uvicorn's server, which on Ctrl-C also stops the engine at once: the open streams then end with
    a 503 event instead of holding the shutdown until uvicorn's grace period cancels them."""

    def __init__(self, config: uvicorn.Config, engine: Engine) -> None:
        super().__init__(config)
        self.engine = engine

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.engine.stop()
        super().handle_exit(sig, frame)
