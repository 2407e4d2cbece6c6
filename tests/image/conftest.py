"""The built image and podman (through scripts/podman.sh, which knows this sandbox's needs).

Building the image takes minutes, so `make test` runs these tests only when it is
already built (and says so when it is not); `make image-test` builds it first and
sets RAILOVER_IMAGE_REQUIRED=1, where a missing image or podman fails instead.
"""

from __future__ import annotations

import os
import subprocess
import tomllib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PODMAN = ROOT / "scripts" / "podman.sh"


def image_name() -> str:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return os.environ.get("RAILOVER_IMAGE") or f"railover:{version}"


def _unavailable(message: str) -> None:
    if os.environ.get("RAILOVER_IMAGE_REQUIRED") == "1":
        pytest.fail(message)
    pytest.skip(message)


@dataclass
class Podman:
    image: str
    started: list[str] = field(default_factory=list)

    def __call__(self, *args: str, check: bool = True, timeout: float = 120) -> str:
        done = subprocess.run(
            [str(PODMAN), *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def start(self, name: str, *args: str) -> str:
        """A detached container, removed at the end of the test."""
        full = f"{name}-{uuid.uuid4().hex[:8]}"
        self("run", "-d", "--name", full, *args)
        self.started.append(full)
        return full

    def logs(self) -> str:
        out = []
        for c in self.started:
            done = subprocess.run(
                [str(PODMAN), "logs", "--tail", "40", c],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=60,
                check=False,
            )
            out.append(f"--- {c}\n{done.stdout}")
        return "\n".join(out)


@pytest.fixture(scope="session")
def podman_image() -> str:
    if (
        not PODMAN.exists()
        or subprocess.run(
            [str(PODMAN), "info"], capture_output=True, timeout=60, check=False
        ).returncode
    ):
        _unavailable("podman does not work here (scripts/podman.sh info failed)")
    image = image_name()
    exists = subprocess.run(
        [str(PODMAN), "image", "exists", image], capture_output=True, timeout=60, check=False
    )
    if exists.returncode:
        _unavailable(f"image {image} is not built: `make image-test` builds it and runs these")
    return image


@pytest.fixture
def podman(podman_image: str) -> Iterator[Podman]:
    p = Podman(podman_image)
    yield p
    for name in reversed(p.started):
        p("rm", "-f", "-t", "2", name, check=False)
