"""The hub path of the data loader (``fancyzhx/ag_news`` through ``datasets``), with the hub call replaced.

This machine has no hub: ``datasets`` is replaced by a module whose ``load_dataset`` returns
local rows in the hub's schema (``text`` = title + " " + description as the original CSV has
them, ``label`` 0-3), or raises what ``datasets`` raises offline.
"""

from __future__ import annotations

import socket
import sys
import types

import pytest

from distrinews.cli import main
from distrinews.data.rows import GET_DATA, HUB_DATASET
from distrinews.data.splits import load_split, read_csv
from distrinews.errors import DataError

# Rows as the original release has them: escapes (\\$, a backslash for a line break, #39;) included.
ORIGINAL_ROWS = [
    (
        "3",
        "Wall St. Bears Claw Back (Reuters)",
        "Reuters - Short-sellers, Wall Street's dwindling\\band of ultra-cynics",
    ),
    ("2", "Phelps wins again", "Michael Phelps #39;s fifth gold medal"),
    ("4", "New chip", "Profit rose to \\$1.2 billion.\\nAnalysts cheered"),
    ("1", "Talks resume", "Diplomats met in Geneva on Monday"),
]


class FakeDataset:
    """What ``datasets.load_dataset(..., split=...)`` returns, as far as the loader uses it."""

    def __init__(self, columns: dict[str, list]):
        self.columns = columns
        self.column_names = list(columns)

    def __getitem__(self, name: str) -> list:
        return self.columns[name]


def hub_rows(rows) -> dict[str, list]:
    """The hub's schema of original CSV rows: the dataset script joins title and description with a space."""
    return {
        "text": [f"{title} {description}" for _, title, description in rows],
        "label": [int(c) - 1 for c, _, _ in rows],
    }


@pytest.fixture
def fake_hub(monkeypatch):
    """Install a fake ``datasets``; ``fake_hub(splits=..., error=...)`` sets what it answers; ``.calls`` records
    requests."""
    monkeypatch.delenv("DISTRINEWS_DATA", raising=False)
    module = types.ModuleType("datasets")
    module.calls = []
    module.splits = {}
    module.error = None

    def load_dataset(name, split=None, **kwargs):
        module.calls.append((name, split))
        if module.error is not None:
            raise module.error
        return FakeDataset(module.splits[split])

    module.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", module)
    return module


def test_hub_rows_are_cleaned_like_the_local_files(tmp_path, fake_hub, write_csv):
    fake_hub.splits = {"test": hub_rows(ORIGINAL_ROWS), "train": hub_rows(ORIGINAL_ROWS[::-1])}
    local = read_csv(write_csv(tmp_path / "test.csv", ORIGINAL_ROWS))

    test = load_split(None, "test")
    train = load_split(None, "train")

    assert fake_hub.calls == [(HUB_DATASET, "test"), (HUB_DATASET, "train")]
    assert test.texts == local.texts  # same article, same text, same token-cache entry
    assert test.labels == local.labels == [2, 1, 3, 0]
    assert (
        "dwindling band" in test.texts[0]
        and "$1.2 billion. Analysts" in test.texts[2]
        and "Phelps's fifth" in test.texts[1]
    )
    assert train.labels == [0, 3, 1, 2]
    assert test.source == f"hub:{HUB_DATASET}/test" and train.source == f"hub:{HUB_DATASET}/train"


def test_data_dir_wins_over_the_hub(tmp_path, fake_hub, write_csv):
    write_csv(tmp_path / "test.csv", ORIGINAL_ROWS)
    assert load_split(str(tmp_path), "test").labels == [2, 1, 3, 0]
    assert fake_hub.calls == []


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"text": ["a b"], "label": [4]}, r"row 0: label 4 is not an integer 0-3"),
        ({"text": ["a b", "c"], "label": [0, -1]}, r"row 1: label -1"),
        ({"text": ["  "], "label": [1]}, r"row 0: empty text"),
        ({"sentence": ["a b"], "label": [1]}, r"missing \['text'\]"),
        ({"text": [], "label": []}, r"no rows"),
    ],
)
def test_unexpected_hub_rows_fail_naming_the_row(fake_hub, columns, message):
    fake_hub.splits = {"test": columns}
    with pytest.raises(DataError, match=message):
        load_split(None, "test")


def _assert_names_both_ways(message: str) -> None:
    assert "\n" not in message
    assert GET_DATA in message
    assert "--data DIR" in message and "DISTRINEWS_DATA" in message and "train.csv" in message
    assert "hub is reachable" in message


def test_offline_without_data_says_both_ways(fake_hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fake_hub.error = ConnectionError("Couldn't reach 'fancyzhx/ag_news' on the Hub (OfflineModeIsEnabled)")
    with pytest.raises(DataError) as caught:
        load_split(None, "train")
    message = str(caught.value)
    _assert_names_both_ways(message)
    assert "offline (HF_HUB_OFFLINE=1) and no copy is cached" in message
    assert "OfflineModeIsEnabled" in message


def online(monkeypatch, resolves: bool = True) -> None:
    """No offline switch, no proxy, and the hub's name resolving (or not)."""
    for name in (
        "HF_HUB_OFFLINE",
        "HF_DATASETS_OFFLINE",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
        "HF_ENDPOINT",
    ):
        monkeypatch.delenv(name, raising=False)

    def getaddrinfo(host, port, *args, **kwargs):
        if not resolves:
            raise socket.gaierror(-2, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.1", port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def test_a_host_that_does_not_resolve_fails_at_once_without_the_retries(fake_hub, monkeypatch):
    online(monkeypatch, resolves=False)
    with pytest.raises(DataError) as caught:
        load_split(None, "train")
    _assert_names_both_ways(str(caught.value))
    assert "huggingface.co does not resolve (Name or service not known" in str(caught.value)
    assert "with HF_HUB_OFFLINE=1 a copy an earlier run downloaded is read from the cache" in str(caught.value)
    assert fake_hub.calls == []  # the hub client, and its ~25 s of retries, never ran


def test_behind_a_proxy_the_name_is_not_probed(fake_hub, monkeypatch):
    online(monkeypatch, resolves=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    fake_hub.splits = {"test": hub_rows(ORIGINAL_ROWS)}
    assert load_split(None, "test").labels == [2, 1, 3, 0]


def test_unreachable_hub_without_data_says_both_ways(fake_hub, monkeypatch):
    online(monkeypatch)
    fake_hub.error = ConnectionError(
        "Couldn't reach 'fancyzhx/ag_news' on the Hub (LocalEntryNotFoundError)\nsecond line"
    )
    with pytest.raises(DataError) as caught:
        load_split(None, "test")
    _assert_names_both_ways(str(caught.value))
    assert "could not download it" in str(caught.value)


def test_without_the_datasets_package_says_both_ways(monkeypatch):
    monkeypatch.delenv("DISTRINEWS_DATA", raising=False)
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(DataError) as caught:
        load_split(None, "test")
    _assert_names_both_ways(str(caught.value))
    assert "'datasets' package" in str(caught.value)


def test_train_command_offline_without_data_is_one_line(fake_hub, monkeypatch, configs_dir, tmp_path, capsys):
    """What `make demo` on a fresh offline clone shows: exit 2 and one line, before any worker starts."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fake_hub.error = ConnectionError("Couldn't reach 'fancyzhx/ag_news' on the Hub (OfflineModeIsEnabled)")
    code = main(
        [
            "train",
            "--config",
            str(configs_dir / "tiny.yaml"),
            "--output-dir",
            str(tmp_path / "run"),
            "--nproc-per-node",
            "2",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("distrinews: error: ")
    _assert_names_both_ways(lines[0])
    assert not (tmp_path / "run").exists()
