"""Distillation under DDP: two ranks, one teacher computation (the first rank's, read by the other after a barrier),
identical replicas; a teacher that does not exist is one line before any rank starts."""

from pathlib import Path

from conftest import QUIET, TINY


def test_two_ranks_distil_from_one_cached_teacher_computation(tmp_path, cli, spread_checkpoint):
    teacher = spread_checkpoint(
        tmp_path / "teacher", ["Oil prices jump", "Chelsea beat Arsenal", "Apple unveils a chip", "Rates rise"]
    )
    cache = tmp_path / "cache"
    args = (
        *TINY,
        *QUIET,
        "--train_samples",
        "64",
        "--eval_samples",
        "32",
        "--max_steps",
        "4",
        "--cache_dir",
        str(cache),
    )
    run = tmp_path / "run"
    out = cli("train", *args, "--teacher_model_name_or_path", str(teacher), "--distillation_alpha", "0.2",
              "--output-dir", str(run), nproc=2).stdout  # fmt: skip
    assert "Teacher:     1 checkpoint(s), 64 rows' probabilities computed" in out, out
    assert "Replicas: identical parameters on the 2 ranks" in out, out
    assert len(list(cache.glob("teacher-*.safetensors"))) == 1

    missing = cli("train", *args, "--teacher_model_name_or_path", str(Path(tmp_path / "nowhere")), "--output-dir",
                  str(tmp_path / "other"), nproc=2, check=False)  # fmt: skip
    assert missing.returncode == 2 and "config field 'teacher_model_name_or_path'" in missing.stderr, missing.stderr
    assert "Traceback" not in missing.stderr
