"""Collective bandwidth as nccl-tests reports it (doc/PERFORMANCE.md), for ``distrinews doctor`` and
``distrinews bench collectives``.

For a message of S bytes taking t seconds over n ranks:

    algbw = S / t
    busbw = algbw * factor     all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, broadcast 1

busbw is comparable across world sizes and with the link's bandwidth; algbw is what a caller sees.
"""

from __future__ import annotations


def bus_factor(op: str, n: int) -> float:
    share = (n - 1) / n
    factors = {"all_reduce": 2 * share, "all_gather": share, "reduce_scatter": share, "broadcast": 1.0}
    if op not in factors:
        raise ValueError(f"unknown collective {op!r}")
    return factors[op]


def bandwidths(op: str, size_bytes: int, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s."""
    alg = size_bytes / seconds
    return alg, alg * bus_factor(op, n)
