"""`make demo` plays its whole script and names every decision in its summary."""

from __future__ import annotations

import io
import re

from rich.console import Console

from railover_testing.demo import run_demo


def test_demo_plays_the_script() -> None:
    out = io.StringIO()
    console = Console(file=out, width=240, force_terminal=False, color_system=None)
    assert run_demo(console=console) == 0
    text = out.getvalue()
    assert "status page: http://127.0.0.1:" in text
    summary = text[text.index("Decisions") :]
    # Act 1: fail over and back; act 2: restart; act 3: the switch moves every node.
    for trigger, action in (
        ("fault:1", "failover"),
        ("failback:1", "failback"),
        ("fault:2", "restart"),
        ("switch:1", "failover"),
        ("maintenance:1", "failover"),
        ("failback:maintenance:1", "failback"),
    ):
        assert re.search(rf"{trigger}\s*│\s*{action}", summary), (trigger, action, summary)
    # n3 reports nothing in act 3; the switch decision moves its rank all the same.
    assert re.search(r"job-a: failover, moving .*n3/rank 13", text)
    # R²CCL balance: each of the 3 RNICs left on the degraded nodes carries a third; the
    # lost rail's channels share their backup's, so 1/24 and 1/12 (the DCR plan: 1, 5, 9, 13).
    assert re.search(
        r"all 16 ranks of job-a balanced their channels at ops_done \d+ \(epoch \d+\), as one: "
        r"channel weights \[0\.0417, 0\.0833\]; a CCL without weights disabled channels "
        r"\[1, 5, 9, 13\] instead",
        text,
    )
    # Act 4: job-a's rail-2 ranks move before the planned window opens, and come back.
    assert "maintenance 1 scheduled; jobs it would restart: none" in text
    ahead = re.search(r"job-a: failover ([0-9.]+) s before the window opens, moving (.*)", text)
    assert ahead is not None and float(ahead.group(1)) > 0, text
    assert ahead.group(2).split(", ") == [f"n{i}/rank {4 * i + 2}" for i in range(4)]
    assert re.search(r"all 16 ranks of job-a back on rail2-a at ops_done \d+", text)
    saved = re.search(r"saved vs\. always restarting: ([0-9.,]+) GPU·h", text)
    assert saved is not None
    assert float(saved.group(1).replace(",", "")) > 0
