"""A ready-to-push Hugging Face Docker Space from a servable checkpoint (``distrinews export --format space``).

``bundle.export_space`` writes, from ``runs/X/best``, the folder the reference system ends with:

    DIR/README.md          Space front matter, the model card, the API's curl calls, how to push
    DIR/Dockerfile         deploy/Dockerfile's design: non-root, HEALTHCHECK, port 7860, CPU only
    DIR/requirements.txt   the server's direct dependencies, pinned; never torch (the Dockerfile installs its CPU build)
    DIR/distrinews/        the serving modules of this package (``python -m distrinews.serve``)
    DIR/model/             the model files of the chosen runtime
    DIR/.gitattributes     large files through Git LFS, as the Hub wants them
    DIR/.gitignore         a local torch wheel staged for a build (.whl/) stays out of the Space

Runtimes: ``onnx-int8`` (default: the smallest), ``onnx`` (fp32) and ``torch``.
"""

# The runtimes a Space can be built for: a subset of the server's (``options.shared.RUNTIMES``).
SPACE_RUNTIMES = ("onnx-int8", "onnx", "torch")
DEFAULT_SPACE_RUNTIME = "onnx-int8"
# Where each runtime's model file lives in the bundle (relative to the bundle, = the image's /app).
MODEL_DIR = "model"
MODEL_FILES = {"onnx-int8": "model.int8.onnx", "onnx": "model.onnx", "torch": "model.safetensors"}
PORT = 7860
