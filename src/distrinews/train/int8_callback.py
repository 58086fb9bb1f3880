"""The int8 model a finished run ships in its best model: ``best/model.int8.onnx``, checked against fp32 on the rows
the run evaluated on (``predict/int8.py``), which ``serve --runtime auto`` then runs. Made on rank 0 when the run
ends, before the other callbacks' end (MLflow's artifacts of ``best/`` include it): part of what the run writes, and
published whole (a temporary name, then a rename). Nothing writes into best/ after the run (a server or an
export keeps what it makes in the cache, ``predict/derived.py``). Not made when the run was stopped."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..checkpoint.rundir import RunDir
from ..config import TrainConfig
from ..data.rows import RawSplit
from .callbacks import TrainEnd, TrainerCallback, TrainerControl

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..checkpoint.records import TrainState


class Int8ModelCallback(TrainerCallback):
    def __init__(self, run_dir: RunDir, eval_rows: RawSplit, say: Callable[..., None]):
        self.run_dir, self.eval_rows, self.say = run_dir, eval_rows, say

    def on_train_end(
        self, args: TrainConfig, state: TrainState, control: TrainerControl, **kw: Unpack[TrainEnd]
    ) -> None:
        if kw.get("stopped_by") is not None or not self.run_dir.best.is_dir():
            return
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            self.say(
                "int8 model: not made (onnxruntime is missing: pip install 'distrinews[onnx]'); serve runs PyTorch"
            )
            return
        from ..predict.int8 import int8_path, make_int8

        rows, best = self.eval_rows, self.run_dir.best
        try:
            path, check = make_int8(best, (list(rows.texts), list(rows.labels)), out=int8_path(best))
        except Exception as exc:  # the run is saved; serving falls back to PyTorch
            self.say(f"int8 model: not made ({type(exc).__name__}: {exc}); serve runs PyTorch")
            return
        verdict = "passed its check, served by default" if check["passed"] else "FAILED its check, serve runs PyTorch"
        self.say(f"int8 model: {path} {verdict} ({check['summary']}; {check['seconds']:.0f} s)")
