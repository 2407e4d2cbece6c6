"""A plugin dropped without finalize must not leave its C thread calling freed callbacks."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def test_dropped_plugin_keeps_its_log_callback_alive(plugin_lib: Path, tmp_path: Path) -> None:
    # In a child process: a crash there is a failed assertion here, not a dead test run.
    script = textwrap.dedent(
        f"""
        import gc, socket, threading
        from native_plugin.binding import Plugin
        path = {str(tmp_path / "agent.sock")!r}
        # An "agent" that hangs up on every connection: the sender thread reconnects and
        # logs each connection, for as long as it runs.
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        srv.listen(16)
        def churn():
            while True:
                conn, _ = srv.accept()
                conn.close()
        threading.Thread(target=churn, daemon=True).start()
        seen = []
        logged = threading.Event()
        def log(lvl, msg):
            seen.append(msg)
            logged.set()
        p = Plugin(socket_path=path, reconnect_min_ms=1, reconnect_max_ms=5,
                   log_interval_ms=1, log=log)
        p.init()
        del p
        gc.collect()
        logged.clear()
        # The sender thread keeps reconnecting and logging after del p: a log line arrives.
        print("alive", logged.wait(30) and len(seen) > 0)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "alive True"
