"""``distrinews export``: the legacy single ``.pt`` file, or an ONNX model (optionally int8)."""

from __future__ import annotations

import argparse
import os


def register(subparsers) -> None:
    p = subparsers.add_parser("export", help="write the legacy single .pt file or an ONNX model")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--format", choices=("pt", "onnx"), required=True)
    p.add_argument("--output")
    p.add_argument("--quantize", choices=("int8",), default=None)
    p.set_defaults(func=run)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    from . import no_extra_arguments, require_extra

    no_extra_arguments("export", extra)
    if args.format == "pt":
        from ..checkpoint import export_legacy_pt

        out = args.output or os.path.join(args.checkpoint.rstrip("/"), "model.pt")
        print(f"wrote {export_legacy_pt(args.checkpoint, out)}")
        return 0
    require_extra("onnx", "onnx", "export --format onnx")
    require_extra("onnxruntime", "onnx", "export --format onnx")
    from ..serve.onnx_export import export_onnx

    # An int8 file never takes the fp32 file's default name, which --runtime onnx would pick up.
    out = args.output or os.path.join(args.checkpoint.rstrip("/"), "model.int8.onnx" if args.quantize else "model.onnx")
    print(f"wrote {export_onnx(args.checkpoint, out, quantize=args.quantize)}")
    return 0
