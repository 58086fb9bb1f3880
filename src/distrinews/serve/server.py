"""Run the app under uvicorn until SIGTERM/SIGINT: stop accepting connections, answer every request in flight, finish
the batcher's queue, exit 0 (1 when the batcher's loop died, so that a supervisor restarts it). Connections are
uvicorn's h11 protocol with deadlines and a cap (``connections``).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable

from .options import API_KEY_ENV, ServeConfig, is_loopback
from .protocol import ServingPredictor


def run_server(config: ServeConfig, predictor_factory: Callable[[], ServingPredictor] | None = None) -> int:
    """Serve with ``config`` (its options already validated); ``predictor_factory`` (tests) replaces loading
    ``config.checkpoint``. 1 when the server could not start or its batcher died, else 0."""
    import uvicorn

    from .app import config_summary, create_app
    from .connections import guarded_protocol

    assert config.port is not None, "validating the options resolves the port"
    app = create_app(config, predictor_factory)
    logging.basicConfig(level=config.log_level.upper(), format="%(levelname)s:     %(name)s: %(message)s")
    log = logging.getLogger("distrinews.serve")
    log.info("serving %s", config_summary(app.state.config))
    if not app.state.config.api_key and not is_loopback(config.host):
        # A warning, not a refusal: an open demo (a Hugging Face Space) is a choice; an unset key is not a typo.
        log.warning(
            "no API key: anyone who reaches %s:%s can use every route (set %s)", config.host, config.port, API_KEY_ENV
        )
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level=config.log_level,
            access_log=not config.no_access_log,
            # uvicorn annotates an int, and passes it to asyncio.wait_for, which takes fractions of a second
            timeout_graceful_shutdown=config.timeout_graceful_shutdown,  # type: ignore[arg-type]
            lifespan="on",
            # The loop the serve extra installs, whatever else is in the environment (uvicorn would take uvloop where
            # some other package brought it): what the tests and benchmarks run is what a user runs.
            loop="asyncio",
            # h11 with deadlines for request headers, bodies and reading answers, a cap on connections (slow clients)
            http=guarded_protocol(
                config.header_timeout, config.max_connections, config.body_timeout, config.send_timeout
            ),
        )
    )
    # uvicorn drains, then re-raises the signal with the handler in place before it: with this one the process exits
    # 0 instead of "killed by SIGTERM", as a requested, completed shutdown is a success.
    received: list[int] = []
    previous = {sig: signal.signal(sig, lambda s, _f: received.append(s)) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:
        return 1  # could not bind the port, or startup failed (uvicorn logged why)
    state = app.state.serve
    if state.batcher is not None and state.batcher.stalled is not None:
        # The stuck forward thread cannot be stopped, and interpreter exit would join it forever.
        log.error("exiting with a forward pass still stuck: %s", state.batcher.stalled)
        logging.shutdown()
        os._exit(1)
    if state.fatal_error is not None:
        log.error("exiting because %s (a supervisor restarts the server)", state.fatal_error)
        return 1
    return 0
