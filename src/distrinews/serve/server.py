"""Run the app under uvicorn until SIGTERM/SIGINT; exit 0 after a clean drain.

SIGTERM stops accepting connections, answers every request already in flight, finishes the
batcher's queue, then exits 0. Connections are uvicorn's h11 protocol with a deadline for a
request's headers and a cap on open connections (``connections``).
"""

from __future__ import annotations

import logging
import signal

from .options import ServeConfig


def run_server(config: ServeConfig) -> int:
    """Serve with ``config`` (its options already validated)."""
    import uvicorn

    from .app import config_summary, create_app
    from .connections import guarded_protocol

    app = create_app(config)
    logging.basicConfig(level=config.log_level.upper(), format="%(levelname)s:     %(name)s: %(message)s")
    logging.getLogger("distrinews.serve").info("serving %s", config_summary(app.state.config))
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level=config.log_level,
            access_log=not config.no_access_log,
            timeout_graceful_shutdown=config.timeout_graceful_shutdown,
            lifespan="on",
            # h11 with a deadline for request headers and a cap on open connections (slow clients)
            http=guarded_protocol(config.header_timeout, config.max_connections),
        )
    )
    # uvicorn drains on SIGTERM/SIGINT, then re-raises the signal with the handler that was
    # in place before it started, so the process would die "killed by SIGTERM" after a clean
    # drain. With this handler in place, the re-raised signal is recorded and we exit 0:
    # a requested, completed shutdown is a success.
    received: list[int] = []
    previous = {sig: signal.signal(sig, lambda s, _f: received.append(s)) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:
        return 1  # could not bind the port, or startup failed (uvicorn logged why)
    return 0
