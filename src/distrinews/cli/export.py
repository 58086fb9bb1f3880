"""``distrinews export``: the legacy single ``.pt`` file (named ``<model>_agnews_v<version>.pt``), or an ONNX model (optionally int8)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from ..config import ConfigError
from ..versioning import DEFAULT_MODEL_VERSION, artifact_name, is_version


def register(subparsers) -> None:
    p = subparsers.add_parser("export", help="write the legacy single .pt file or an ONNX model")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--format", choices=("pt", "onnx"), required=True)
    p.add_argument("--output")
    p.add_argument("--quantize", choices=("int8",), default=None)
    p.add_argument("--version", help="model version MAJOR.MINOR.PATCH to stamp on the export (default: the checkpoint's, else 1.0.0)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    from . import no_extra_arguments, require_extra

    no_extra_arguments("export", extra)
    if args.version is not None and not is_version(args.version):
        raise ConfigError(f"--version {args.version!r}: must be MAJOR.MINOR.PATCH, e.g. 1.0.0")
    if args.format == "pt":
        from ..checkpoint import export_legacy_pt

        out = args.output or os.path.join(args.checkpoint.rstrip("/"), _versioned_pt_name(args.checkpoint, args.version))
        print(f"wrote {export_legacy_pt(args.checkpoint, out, model_version=args.version)}")
        return 0
    require_extra("onnx", "onnx", "export --format onnx")
    require_extra("onnxruntime", "onnx", "export --format onnx")
    from ..serve.onnx_export import export_onnx

    # An int8 file never takes the fp32 file's default name, which --runtime onnx would pick up.
    out = args.output or os.path.join(args.checkpoint.rstrip("/"), "model.int8.onnx" if args.quantize else "model.onnx")
    print(f"wrote {export_onnx(args.checkpoint, out, quantize=args.quantize)}")
    return 0


def _versioned_pt_name(checkpoint: str, version: str | None) -> str:
    """``<model>_agnews_v<version>.pt``, from the checkpoint's ``distrinews.json`` when it has one."""
    info_path = Path(checkpoint) / "distrinews.json"
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    return artifact_name(info.get("model_name"), version or info.get("model_version") or DEFAULT_MODEL_VERSION)
