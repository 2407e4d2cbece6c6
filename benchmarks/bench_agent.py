"""The agent's own cost: CPU share and resident memory while polling 10 RNICs at 1 Hz.

Runs the real ``railover-agent`` process against a fixture node of shape (a)
(8 GPU RNICs + 2 storage NICs = 10 RNIC ports, 8 GPUs) and a stand-in service
on loopback, with a port flip every 10 s so the reporting path is exercised
too. CPU is the process's own utime+stime from /proc (not wall time, so other
load on the machine does not inflate it); RSS is VmRSS sampled every second.
Also times one poll of the ports/counters/pcie collectors in-process.

    .venv/bin/python -m benchmarks.bench_agent [--seconds 60] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agent.collectors.base import CollectorContext
from agent.collectors.counters import CountersCollector
from agent.collectors.pcie import PcieCollector
from agent.collectors.ports import PortsCollector
from agent.collectors.topology import TopologyCollector
from agent.config import AgentSettings
from agent.railmap import load_rail_map
from railover_testing.agents import StandInService, short_socket_path
from railover_testing.sysfs_faults import set_port_state
from railover_testing.sysfs_node import shape_a, write_rail_map

CPU_AIM = 0.01  # share of one core
RSS_AIM = 60 * 2**20


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def poll_cost(root: Path, rails: Path, work: Path, n: int = 300) -> dict[str, float]:
    settings = AgentSettings(
        service_url="http://127.0.0.1:1",
        node_name="bench",
        sysfs_root=root,
        proc_root=Path("/proc"),
        rail_map=rails,
        spool_dir=work / "spool-inproc",
    )
    ctx = CollectorContext(settings, load_rail_map(rails), lambda _k: None)
    topo = TopologyCollector(ctx).collect(None).topology
    assert topo is not None
    collectors = [PortsCollector(ctx), CountersCollector(ctx), PcieCollector(ctx)]
    for c in collectors:
        c.collect(topo)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        for c in collectors:
            c.collect(topo)
        times.append(time.perf_counter() - t)
    return {
        "poll_p50_us": _pct(times, 0.5) * 1e6,
        "poll_p99_us": _pct(times, 0.99) * 1e6,
        "rnic_ports": len(topo.rnic_ports()),
    }


def run(seconds: float) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-agent-"))
    node = shape_a(work / "sys")
    rails = write_rail_map(work / "rails.json", node.rail_map())
    svc = StandInService()
    agent_bin = Path(sys.executable).with_name("railover-agent")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAILOVER_AGENT_")}
    env.update(
        {
            "RAILOVER_AGENT_SERVICE_URL": svc.url,
            "RAILOVER_AGENT_NODE_NAME": "bench",
            "RAILOVER_AGENT_SYSFS_ROOT": str(node.root),
            "RAILOVER_AGENT_RAIL_MAP": str(rails),
            "RAILOVER_AGENT_SPOOL_DIR": str(work / "spool"),
            "RAILOVER_AGENT_SOCKET": str(short_socket_path()),
            "RAILOVER_AGENT_METRICS_HOST": "127.0.0.1",
            "RAILOVER_AGENT_METRICS_PORT": "0",
            "RAILOVER_AGENT_POLL_INTERVAL_S": "1.0",
            "RAILOVER_AGENT_LOG_LEVEL": "WARNING",
        }
    )
    proc = subprocess.Popen([str(agent_bin)], env=env)
    try:
        deadline = time.monotonic() + 30
        while "bench" not in svc.state.nodes:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("agent did not register")
            time.sleep(0.1)
        time.sleep(3)  # past start-up (imports, first topology walk)
        cpu0, t0 = _cpu_seconds(proc.pid), time.monotonic()
        rss: list[int] = []
        flips = 0
        end = t0 + seconds
        while time.monotonic() < end:
            time.sleep(1.0)
            rss.append(_rss_bytes(proc.pid))
            if len(rss) % 10 == 0:
                # One port down, then the same port back up, ten seconds apart.
                flips += 1
                state = "DOWN" if flips % 2 else "ACTIVE"
                set_port_state(node.root, f"mlx5_{(flips - 1) // 2 % 8}", 1, state)
        cpu1, t1 = _cpu_seconds(proc.pid), time.monotonic()
        time.sleep(1.5)  # let the last flip's event arrive before counting
    finally:
        proc.terminate()
        proc.wait(15)
        svc.stop()
    share = (cpu1 - cpu0) / (t1 - t0)
    result: dict[str, Any] = {
        "seconds": round(t1 - t0, 1),
        "rnic_ports": 10,
        "poll_interval_s": 1.0,
        "cpu_share_of_core": share,
        "cpu_vs_aim": share / CPU_AIM,
        "rss_max_mib": max(rss) / 2**20,
        "rss_mean_mib": statistics.fmean(rss) / 2**20,
        "rss_vs_aim": max(rss) / RSS_AIM,
        "events_delivered": len(svc.state.events),
        "port_flips": flips,
    }
    result.update(poll_cost(node.root, rails, work))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = run(args.seconds)
    if args.json:
        print(json.dumps(r, indent=2))
        return
    print(f"railover-agent polling {r['rnic_ports']} RNIC ports at 1 Hz for {r['seconds']} s")
    print(
        f"  CPU share   {r['cpu_share_of_core'] * 100:.3f} % of one core"
        f"  ({r['cpu_vs_aim']:.2f}x the 1 % aim)"
    )
    print(
        f"  RSS         max {r['rss_max_mib']:.1f} MiB, mean {r['rss_mean_mib']:.1f} MiB"
        f"  ({r['rss_vs_aim']:.2f}x the 60 MB aim)"
    )
    print(f"  one poll    p50 {r['poll_p50_us']:.0f} us, p99 {r['poll_p99_us']:.0f} us in-process")
    print(f"  events      {r['events_delivered']} delivered ({r['port_flips']} port flips)")


if __name__ == "__main__":
    main()
