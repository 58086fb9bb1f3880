"""Which nodes reached the rendezvous, so that a node that never joins is named, not just counted: beside torchrun's
c10d rendezvous (which times out with a bare ``RendezvousTimeoutError``), each node's launcher signs in to the same
store under its node rank and host name, and on a timeout the signatures say which node rank(s) never came.
"""

from __future__ import annotations

import datetime
import json
import socket
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch._C._distributed_c10d import TCPStore


class RollCall:
    def __init__(self, endpoint: str, run_id: str, node_rank: int | None, nnodes: int, timeout_s: float):
        host, _, port = endpoint.rpartition(":")
        self.host, self.port = host or endpoint, int(port or 29400)
        self.prefix = f"distrinews/rollcall/{run_id}/"
        self.node_rank, self.nnodes, self.timeout_s = node_rank, nnodes, timeout_s
        self.me = socket.gethostname()
        self._store: TCPStore | None = None
        self._thread = threading.Thread(target=self._sign_in, name="distrinews-rollcall", daemon=True)

    def start(self) -> RollCall:
        self._thread.start()
        return self

    def _sign_in(self) -> None:
        from torch._C._distributed_c10d import TCPStore

        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            try:  # the store exists once the endpoint's node has started its rendezvous
                store = TCPStore(self.host, self.port, is_master=False, timeout=datetime.timedelta(seconds=5))
                name = self.node_rank if self.node_rank is not None else self.me
                store.set(f"{self.prefix}{name}", json.dumps({"host": self.me}))
                self._store = store
                return
            except Exception:
                time.sleep(1)

    def attendance(self) -> dict[str, str] | None:
        """``{node: host}`` of every node that signed in, or None when the store could not be read."""
        if self._store is None:
            return None
        try:
            keys = {str(r): f"{self.prefix}{r}" for r in range(self.nnodes)} if self.node_rank is not None else {}
            return {name: json.loads(self._store.get(k))["host"] for name, k in keys.items() if self._store.check([k])}
        except Exception:
            return None

    def explain_timeout(self) -> str:
        where = f"{self.host}:{self.port}"
        present = self.attendance()
        if present is None:
            return (
                f"the rendezvous at {where} timed out: this node ({self.me}) could not reach it; start the node whose "
                f"address is {self.host} first, and check that port {self.port} is open between the nodes"
            )
        if self.node_rank is None:
            return (
                f"the rendezvous at {where} timed out before {self.nnodes} nodes joined; give every node --node-rank "
                "to have the missing ones named"
            )
        missing = [r for r in range(self.nnodes) if str(r) not in present]
        joined = ", ".join(f"node {r} on {h}" for r, h in sorted(present.items()))
        return (
            f"the rendezvous at {where} timed out: node rank(s) {', '.join(map(str, missing))} never joined "
            f"(joined: {joined}); start them with the same command and --rdzv-endpoint {where}, "
            f"and check that they can reach {where}"
        )
