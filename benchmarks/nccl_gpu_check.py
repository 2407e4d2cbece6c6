"""Real-NCCL check of the profiler plugin: needs one CUDA GPU and PyTorch with NCCL.

One process, one GPU: a loop of all-reduces through PyTorch's NCCL backend with
NCCL_PROFILER_PLUGIN pointing at native_plugin/build/libnccl-profiler-railover.so,
and a listener on the plugin's socket standing in for the agent. Passes when the
communicator was announced and the last ops_done equals the collectives issued.
Prints one JSON line with the figures for benchmarks/RESULTS.md.

Written without a GPU machine at hand (none was lent to the session that wrote
it): run it where one is, and record the result.
Usage: .venv/bin/python -m benchmarks.nccl_gpu_check [--collectives N]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from native_plugin import wire, wire_codec

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "native_plugin" / "build" / "libnccl-profiler-railover.so"


class Listener:
    """Keeps the newest ops_done per (comm, rank), the communicators and the stalls."""

    def __init__(self, path: Path) -> None:
        self.ops: dict[tuple[int, int], int] = {}
        self.comms: list[wire.Communicator] = []
        self.stalls: list[wire.Stall] = []
        self.closed = threading.Event()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen(1)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        conn, _ = self._server.accept()
        decoder = wire_codec.FrameDecoder()
        with conn:
            while data := conn.recv(1 << 16):
                for m in decoder.feed(data):
                    if isinstance(m, wire.Progress):
                        self.ops[(m.comm_id, m.rank)] = m.ops_done
                    elif isinstance(m, wire.Communicator):
                        self.comms.append(m)
                    elif isinstance(m, wire.Stall):
                        self.stalls.append(m)
        self.closed.set()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--collectives", type=int, default=1000)
    args = parser.parse_args()
    if not LIBRARY.is_file():
        print(f"build it first: make -C native_plugin ({LIBRARY} is missing)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="rvn-gpu-"))
    try:
        return check(args.collectives, tmp / "agent.sock")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check(collectives: int, sock: Path) -> int:
    listener = Listener(sock)
    os.environ.update(
        NCCL_PROFILER_PLUGIN=str(LIBRARY),
        RAILOVER_PLUGIN_SOCKET=str(sock),
        RAILOVER_NCCL_PROGRESS_MS="10",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="29511",
    )
    # Imported here: the rest of the repository never needs PyTorch.
    torch: Any = importlib.import_module("torch")
    dist: Any = importlib.import_module("torch.distributed")
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        print("needs a CUDA GPU and PyTorch built with NCCL", file=sys.stderr)
        return 2
    device = torch.device("cuda:0")
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    x = torch.ones(1 << 20, device=device)
    started = time.perf_counter()
    for _ in range(collectives):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    dist.destroy_process_group()  # NCCL finalizes the plugin, which sends its last count
    listener.closed.wait(30)
    final = max(listener.ops.values(), default=0)
    ok = bool(listener.comms) and final == collectives and not listener.stalls
    print(
        json.dumps(
            {
                "ok": ok,
                "collectives": collectives,
                "ops_done": {f"{c:x}/{r}": n for (c, r), n in listener.ops.items()},
                "communicators": [
                    {"comm_id": f"{c.comm_id:x}", "rank": c.rank, "nranks": c.nranks}
                    for c in listener.comms
                ],
                "stalls": len(listener.stalls),
                "all_reduce_per_s": round(collectives / seconds, 1),
                "torch": str(torch.__version__),
                "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            }
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
