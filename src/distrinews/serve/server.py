"""Run the app under uvicorn until SIGTERM/SIGINT; exit 0 after a clean drain.

SIGTERM stops accepting connections, answers every request already in flight, finishes the
batcher's queue, then exits 0.
"""

from __future__ import annotations

import argparse
import logging
import signal


def run_server(args: argparse.Namespace) -> int:
    """Serve with the options of ``options.add_arguments`` (already validated)."""
    import uvicorn

    from .app import ServeConfig, config_summary, create_app

    config = ServeConfig(
        checkpoint=args.checkpoint,
        runtime=args.runtime,
        onnx_model=args.onnx_model,
        max_batch_size=args.max_batch_size,
        max_batch_tokens=args.max_batch_tokens or None,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
        max_batch_texts=args.max_batch_texts,
        max_text_chars=args.max_text_chars,
        max_body_bytes=args.max_body_bytes,
    )
    app = create_app(config)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s:     %(name)s: %(message)s")
    logging.getLogger("distrinews.serve").info("serving %s", config_summary(app.state.config))
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            access_log=not args.no_access_log,
            timeout_graceful_shutdown=args.timeout_graceful_shutdown,
            lifespan="on",
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
