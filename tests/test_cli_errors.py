"""Bad input through the command line: exit status 2 and a message that names what is wrong."""

from conftest import CONFIGS, run_cli, write_csv


def _train(*args, data):
    return run_cli("train", "--config", str(CONFIGS / "tiny.yaml"), "--data", str(data), "--disable_tqdm", "true", *args, check=False)


def test_missing_data_directory(tmp_path):
    proc = _train("--output-dir", str(tmp_path / "run"), data=tmp_path / "no-such-dir")
    assert proc.returncode == 2
    assert "no-such-dir does not exist. Point --data (or $DISTRINEWS_DATA)" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_malformed_csv_names_file_and_line(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_csv(data / "train.csv", [("1", "a", "b")] * 10 + [("7", "bad", "label")])
    write_csv(data / "test.csv", [("1", "a", "b")] * 4)
    proc = _train("--output-dir", str(tmp_path / "run"), data=data)
    assert proc.returncode == 2
    assert f"{data / 'train.csv'}:11: class 7 is outside 1-4" in proc.stderr


def test_unknown_config_key_under_torchrun_launcher(tmp_path):
    proc = run_cli("train", "--config", str(CONFIGS / "tiny.yaml"), "--per_device_train_batch", "8", nproc=2, check=False)
    assert proc.returncode == 2
    assert "unknown config field 'per_device_train_batch'" in proc.stderr
    assert "did you mean 'per_device_train_batch_size'" in proc.stderr


def test_predict_rejects_empty_text(tmp_path):
    proc = run_cli("predict", "--checkpoint", str(tmp_path), "   ", check=False)
    assert proc.returncode == 2 and "text #1 is empty" in proc.stderr
