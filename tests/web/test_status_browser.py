"""The status page in a real headless Chromium (Debian's), driven by Playwright.

Playwright never downloads a browser here: it launches /usr/bin/chromium with a
fresh profile. The screenshot lands in test-artifacts/status-page.png.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest

from railover_testing.local import local_service
from scheduler_svc.config import Settings
from tests.deploy.tools import need_tool
from tests.web.scenario import failed_over_cluster, fault

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def live_service(db_url: str) -> Iterator[tuple[str, datetime]]:
    with local_service(Settings(db_url=db_url, port=0, allow_anonymous_loopback=True)) as url:
        with httpx.Client(base_url=url, timeout=30) as http:
            checkpoint = failed_over_cluster(http)
        yield url, checkpoint


@pytest.mark.slow
def test_status_page_in_chromium(live_service: tuple[str, datetime], tmp_path: Path) -> None:
    url, checkpoint = live_service
    chromium = need_tool("chromium")
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            user_data_dir=str(tmp_path / "profile"),
            executable_path=chromium,
            headless=True,  # Playwright adds --headless itself
            args=CHROMIUM_FLAGS,
            viewport={"width": 1500, "height": 1150},
        )
        try:
            page = context.new_page()
            page.goto(url + "/")
            grid = page.locator("#grid table.grid")
            expect(grid).to_be_visible()
            assert grid.locator("tbody tr").count() == 4
            assert grid.locator("td.cell").count() == 32
            assert grid.locator('td.cell[data-health="fault"]').count() == 2
            job_b = page.locator('tr.job[data-job="job-b"]')
            expect(job_b).to_have_attribute("data-mode", "failed_over")
            expect(job_b.locator(".badge")).to_have_text("failed over")
            with httpx.Client(base_url=url) as http:
                status = http.get("/v1/status").json()
            reason = next(j for j in status["jobs"] if j["job_id"] == "job-b")["latest_decision"]
            expect(job_b.locator(".reason")).to_contain_text(reason["reason"])
            expect(job_b.locator(".reason")).to_contain_text("fail over")
            expect(page.locator('tr.job[data-job="job-a"] .reason')).to_contain_text("restart:")

            # Live: a third fault appears on the page without a reload.
            with httpx.Client(base_url=url) as http:
                at = checkpoint + timedelta(seconds=1600)
                r = http.post("/v1/events", json=fault("n2", "mlx5_2", at))
                assert r.status_code == 202, r.text
            expect(grid.locator('td.cell[data-health="fault"]')).to_have_count(3, timeout=10_000)
            expect(page.locator("#refresh-state")).to_contain_text("updated")
            page.screenshot(path=str(ARTIFACTS / "status-page.png"), full_page=True)
        finally:
            context.close()
    assert (ARTIFACTS / "status-page.png").stat().st_size > 10_000
