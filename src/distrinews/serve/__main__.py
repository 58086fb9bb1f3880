"""``python -m distrinews.serve``: the REST API without the training stack (the Space bundle's entry point).

The options, API and hardening of ``distrinews serve``, importing only the serving modules: with ``--runtime onnx``
and a checkpoint holding its ONNX file and ``tokenizer.json`` neither torch nor transformers is imported, so it runs
in an image with just onnxruntime, tokenizers, numpy, fastapi, uvicorn, pydantic and prometheus-client.
"""

from __future__ import annotations

import argparse
import sys

from ..checkpoint.tokenizer_files import needs_own_tokenizer, require_tokenizer
from ..errors import CheckpointError, one_line
from .options import ServeConfig, ServeOptionError, add_arguments, validate
from .server import run_server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m distrinews.serve", description="DistriNews REST API (a text classifier)"
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        validate(args)
        if needs_own_tokenizer(args.checkpoint):  # every runtime, torch or not: a model folder without its tokenizer
            require_tokenizer(args.checkpoint)
        if args.runtime == "torch":  # torch is there: refuse a damaged checkpoint before listening, as serve does
            from ..checkpoint.servable import check_loadable

            check_loadable(args.checkpoint)
    except (ServeOptionError, FileNotFoundError, CheckpointError) as exc:
        print(one_line(exc), file=sys.stderr)
        return 2
    return run_server(ServeConfig.from_args(args))


if __name__ == "__main__":
    sys.exit(main())
