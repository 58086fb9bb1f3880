"""``distrinews export``: the legacy single ``.pt`` file (named ``<model>_agnews_v<version>.pt``), an ONNX model
(optionally int8), or a ready-to-push Hugging Face Docker Space (``--format space``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..checkpoint.records import SERVABLE_INFO
from ..checkpoint.versioning import DEFAULT_MODEL_VERSION, artifact_name, is_version
from ..config import ConfigError
from ..errors import one_line
from ..export.space import DEFAULT_SPACE_RUNTIME, SPACE_RUNTIMES
from ..options import Option, add_options
from ..options.shared import CHECKPOINT, DATA
from .common import no_extra_arguments, require_extra

if TYPE_CHECKING:
    from .common import Subparsers


OPTIONS = [
    CHECKPOINT,
    Option("format", required=True, choices=("pt", "onnx", "space")),
    Option(
        "output",
        help="file (pt, default: MODEL_agnews_vVERSION.pt beside the checkpoint; onnx, default: the cache of files "
        "made from the checkpoint, which serve and predict read) or directory (space; default: RUN/space-RUNTIME "
        "beside the checkpoint); never inside a step-N, whose manifest would refuse it",
    ),
    Option("quantize", help="onnx: int8 dynamic quantization", choices=("int8",)),
    Option(
        "version", help="model version MAJOR.MINOR.PATCH to stamp on the export (default: the checkpoint's, else 1.0.0)"
    ),
]
# The runtime a Space runs is not serve's --runtime (no auto, no torch-bf16), and None says it was not given, which
# only --format space allows (SPACE_ONLY).
SPACE_OPTIONS = [
    Option("runtime", help=f"what the Space runs (default: {DEFAULT_SPACE_RUNTIME})", choices=SPACE_RUNTIMES),
    Option(
        "check_accuracy",
        False,
        "onnx-int8: measure int8 against fp32 first, on the evaluation rows of the model's training data "
        "(accuracy; a multi-label model's micro-F1 at its thresholds)",
        switch=True,
    ),
    DATA,
    Option("push_to_hub", metavar="REPO_ID", help="create the Docker Space OWNER/NAME if new and upload the folder"),
    Option("private", False, "with --push-to-hub: a private Space", switch=True),
    Option("base_image", help="the Dockerfile's default BASE_IMAGE (default: python:3.X-slim of this Python)"),
]
SPACE_ONLY = tuple(option.name for option in SPACE_OPTIONS)


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser("export", help="write the legacy .pt file, an ONNX model, or a Hugging Face Space folder")
    add_options(p, OPTIONS)
    add_options(p.add_argument_group("--format space"), SPACE_OPTIONS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    no_extra_arguments("export", extra)
    if args.version is not None and not is_version(args.version):
        raise ConfigError(f"--version {args.version!r}: must be MAJOR.MINOR.PATCH, e.g. 1.0.0")
    if args.format != "space":
        given = [f"--{name.replace('_', '-')}" for name in SPACE_ONLY if getattr(args, name) not in (None, False)]
        if given:
            raise ConfigError(f"{', '.join(given)} only apply to --format space")
    _refuse_output_inside_a_step(args.output)
    if args.format == "space":
        if args.quantize:
            raise ConfigError("--quantize does not apply to --format space: choose --runtime onnx-int8")
        return _space(args)
    if args.format == "pt":
        from ..export.seed_pt_writer import export_seed_pt

        # beside the checkpoint, as the Space's folder: a published checkpoint is never written again
        out = args.output or Path(args.checkpoint).resolve().parent / _versioned_pt_name(args.checkpoint, args.version)
        print(f"wrote {export_seed_pt(args.checkpoint, out, model_version=args.version)}")
        return 0
    require_extra("onnx", "export --format onnx")
    from ..export.onnx import export_onnx

    out = export_onnx(args.checkpoint, args.output, quantize=args.quantize)
    where = "" if args.output else " (the cache of files made from the checkpoint, which serve and predict read)"
    print(f"wrote {out}{where}")
    return 0


def _refuse_output_inside_a_step(output: str | None) -> None:
    """A ``step-N`` is published with a manifest of every file it holds: one written into it later would make it
    refused, to serve and to resume."""
    from ..checkpoint.manifest import MANIFEST

    for folder in Path(output).resolve().parents if output is not None else ():
        if (folder / MANIFEST).is_file():
            raise ConfigError(
                f"--output {output}: inside the checkpoint {folder}, which is never written after it is published "
                f"(its {MANIFEST} would refuse the file); write it elsewhere"
            )


def _space(args: argparse.Namespace) -> int:
    from ..export.space.bundle import export_space

    runtime = args.runtime or DEFAULT_SPACE_RUNTIME
    if runtime != "torch":
        require_extra("onnx", f"export --format space --runtime {runtime}")
    if args.push_to_hub:
        require_extra("hub", "export --push-to-hub")
    checkpoint = Path(args.checkpoint)
    output = Path(args.output) if args.output else checkpoint.resolve().parent / f"space-{runtime}"
    bundle = export_space(
        checkpoint,
        output,
        runtime=runtime,
        version=args.version,
        check_accuracy=args.check_accuracy,
        data_dir=args.data,
        repo_id=args.push_to_hub,
        base_image=args.base_image,
    )
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file() and ".git" not in p.relative_to(bundle).parts)
    print(
        f"wrote {bundle} ({runtime}, {size / 1e6:.1f} MB): push it to a Docker Space with git (its README.md says how)"
    )
    if args.push_to_hub:
        from ..checkpoint.records import read_servable_info
        from ..export.space.push import PushError, push_to_hub

        message = f"DistriNews v{read_servable_info(bundle / 'model').model_version} ({runtime})"
        try:
            url = push_to_hub(bundle, args.push_to_hub, private=args.private, commit_message=message)
        except PushError as exc:
            print(one_line(exc), file=sys.stderr)
            return 1
        print(f"pushed to {url}")
    return 0


def _versioned_pt_name(checkpoint: str, version: str | None) -> str:
    """``<model>_agnews_v<version>.pt``, from the checkpoint's ``distrinews.json`` when it has one."""
    from ..checkpoint.records import read_servable_info

    path = Path(checkpoint)
    info = read_servable_info(path) if (path / SERVABLE_INFO).is_file() else None
    model_name, recorded = (info.model_name, info.model_version) if info else (None, None)
    return artifact_name(model_name, version or recorded or DEFAULT_MODEL_VERSION)
