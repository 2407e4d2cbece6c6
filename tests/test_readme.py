"""The README's runnable examples, run as written against a live service on loopback.

A shell block counts when the line before its opening fence is `<!-- runnable -->`
(README.md, and deploy/README.md once it exists). Each block runs under `bash -e` in a
fresh folder holding a copy of `examples/`, with the installed console scripts first on
PATH and nothing of this machine's RAILOVER_* environment. The one liberty taken: the
README's port 8080 becomes a free one, so parallel runs and a service already on 8080
are never touched. Whatever the block left running (`railover serve &`) is ended with
its process group.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MARKER = "<!-- runnable -->"
FENCE = re.compile(r"^```(?:sh|bash|shell)\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def runnable_blocks(text: str) -> list[str]:
    blocks = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        if before.strip() == MARKER:
            blocks.append(match.group(1))
    return blocks


def _documents() -> list[tuple[str, int, str]]:
    found = []
    for name in ("README.md", "deploy/README.md"):
        path = REPO / name
        if path.exists():
            found += [(name, i, b) for i, b in enumerate(runnable_blocks(path.read_text()))]
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_readme_marks_its_api_and_planning_examples_runnable() -> None:
    blocks = runnable_blocks((REPO / "README.md").read_text())
    joined = "\n".join(blocks)
    assert len(blocks) >= 2
    # The fleet-manager walk-through: service, token, nodes, job, checkpoint, decisions.
    for needle in ("railover serve", "token create", "/v1/jobs", "examples/job.json"):
        assert needle in joined
    # Every POST/PUT with a body says it is JSON.
    for line in joined.replace("\\\n", " ").splitlines():
        if re.search(r"curl .* -d ", line):
            assert '"$JSON"' in line or "application/json" in line, line


def test_marker_parsing_takes_only_marked_shell_blocks() -> None:
    text = f"```sh\nnot this\n```\n\n{MARKER}\n```sh\necho this\n```\n\n{MARKER}\n\n```py\nx\n```\n"
    assert runnable_blocks(text) == ["echo this\n"]


@pytest.mark.parametrize(
    ("doc", "index", "block"),
    [pytest.param(*d, id=f"{d[0]}#{d[1]}") for d in _documents()],
)
def test_runnable_block(doc: str, index: int, block: str, tmp_path: Path) -> None:
    assert shutil.which("curl"), "the README's examples need curl (apt-get install curl)"
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    script = block.replace("8080", str(_free_port()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAILOVER_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = str(tmp_path)
    # Files, not pipes: the background service keeps its copies open after bash exits.
    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
    with out_path.open("w") as stdout, err_path.open("w") as stderr:
        proc = subprocess.Popen(
            ["bash", "-e", "-c", script],
            cwd=tmp_path,
            env=env,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=240)
        finally:
            # The block's background service, and anything else it started.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    out, err = out_path.read_text(), err_path.read_text()
    assert proc.returncode == 0, f"{doc} block {index} failed:\n{out[-2000:]}\n{err[-3000:]}"
    assert "Traceback" not in err, err[-3000:]
    if "/v1/jobs" in block:
        # The job was stored as the README's body gives it, and the calls after it answered.
        assert '"job_id":"llama"' in out, out[-2000:]
        assert '"recommendation"' in out or '"action"' in out, out[-2000:]


def test_make_demo_installs_the_runtime_only(tmp_path: Path) -> None:
    """`make demo` on a fresh clone: `pip install -e .`, no extras, so no torch or Playwright."""
    import tomllib

    venv = tmp_path / "venv"  # never created: `make -n` only prints what it would run
    plan = subprocess.run(
        # Under `make test` this runs inside make, which would print "Entering directory".
        ["make", "-n", "--no-print-directory", "demo", f"VENV={venv}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    installs = [line for line in plan.splitlines() if "pip install" in line]
    assert installs, plan
    assert all("[" not in line for line in installs), installs  # no extra at all
    assert any(line.rstrip().endswith("-e .") for line in installs), installs
    assert plan.rstrip().endswith(f"{venv}/bin/python -m railover_testing.demo")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = " ".join(project["dependencies"]).lower()
    for heavy in ("torch", "playwright", "pytest", "mypy", "hypothesis", "matplotlib"):
        assert heavy not in runtime, heavy
    # ...and `make test` gets them, through the dev extra.
    extras = project["optional-dependencies"]
    assert extras["dev"] == ["railover[test,lint]"]
    assert any(d.startswith("torch") for d in extras["test"])
    assert not venv.exists()
