"""AG News from the Hugging Face hub (``datasets``), checked row by row, when no local copy is given."""

from __future__ import annotations

import os
import socket
import urllib.parse

from ..errors import DataError
from .rows import AG_NEWS_LABELS as LABELS
from .rows import GET_DATA, HUB_DATASET, RawSplit, clean_text


def _hub_offline() -> bool:
    return any(
        os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
        for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def _hub_unreachable() -> str | None:
    """Why the hub cannot be reached, when that is known at once (its name does not resolve; ``datasets`` would retry
    for ~25 s first), else None. Behind a proxy the name may resolve only at the proxy: nothing is probed."""
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    host = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
    except OSError as exc:
        return f"{host} does not resolve ({exc.strerror or exc})"
    return None


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def load_from_hub(split: str) -> RawSplit:
    """``fancyzhx/ag_news`` through ``datasets`` (which caches it; offline, a copy an earlier run cached is read). Its
    rows are the original CSV's joined with the release's escapes still in them, so they are cleaned like the local
    files: the same article gives the same text (and token cache entry) either way."""
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"no data directory given, and the hub path needs the 'datasets' package (not installed); {GET_DATA}"
        ) from None
    unreachable = None if _hub_offline() else _hub_unreachable()
    if unreachable:
        raise DataError(
            f"no data directory given and the Hugging Face hub cannot be reached ({unreachable}; with "
            f"HF_HUB_OFFLINE=1 a copy an earlier run downloaded is read from the cache); {GET_DATA}"
        )
    try:
        ds = datasets.load_dataset(HUB_DATASET, split=split)
    except Exception as exc:  # network, offline mode, auth, a moved dataset: all leave the user the same two ways
        why = (
            "the hub is offline (HF_HUB_OFFLINE=1) and no copy is cached" if _hub_offline() else "could not download it"
        )
        raise DataError(
            f"no data directory given and {HUB_DATASET} is not available: {why} ({_first_line(exc)}); {GET_DATA}"
        ) from None
    where = f"hub:{HUB_DATASET}/{split}"
    missing = {"text", "label"} - set(ds.column_names)
    if missing:
        raise DataError(f"{where}: expected columns text and label, missing {sorted(missing)}")
    texts, labels = [], []
    for i, (raw_text, label) in enumerate(zip(ds["text"], ds["label"])):
        if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < len(LABELS):
            raise DataError(f"{where} row {i}: label {label!r} is not an integer 0-{len(LABELS) - 1}")
        text = clean_text(raw_text or "", "")
        if not text:
            raise DataError(f"{where} row {i}: empty text")
        texts.append(text)
        labels.append(label)
    if not labels:
        raise DataError(f"{where}: no rows")
    return RawSplit(texts, labels, where, [f"{where} row {i}" for i in range(len(labels))])
