"""Running an app under uvicorn, with the fast event loop and HTTP parser when they are installed."""

from __future__ import annotations

import importlib.util

import uvicorn


def uvicorn_config(app, host: str, port: int, log_level: str = "warning") -> uvicorn.Config:
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return uvicorn.Config(app, host=host, port=port, loop=loop, http=http, access_log=False,
                          log_level=log_level, lifespan="on", timeout_graceful_shutdown=5)


def serve(app, host: str, port: int, log_level: str = "warning") -> None:
    """Serve until SIGINT/SIGTERM."""
    uvicorn.Server(uvicorn_config(app, host, port, log_level)).run()
