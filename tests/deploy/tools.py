"""External tools the deploy and web tests drive (promtool, prometheus, chromium, kubectl).

`make test` installs them (see the Makefile) and sets RAILOVER_REQUIRE_TOOLS=1, so
there a missing tool fails the test instead of skipping it: CI must not go green
without having validated the manifests, rules and page.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import NoReturn

import pytest


def tool_missing(message: str) -> NoReturn:
    """Skip, or fail under RAILOVER_REQUIRE_TOOLS=1: every suite's policy for absent tools."""
    if os.environ.get("RAILOVER_REQUIRE_TOOLS") == "1":
        pytest.fail(message)
    pytest.skip(message)


def need_tool(name: str) -> str:
    """The tool's path, or skip (fail under RAILOVER_REQUIRE_TOOLS=1) when it is missing."""
    # The virtual environment's scripts (kubernetes-validate) first, then PATH.
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    path = shutil.which(name, path=search)
    if path is None:
        tool_missing(f"{name} is not installed (`make test` installs it)")
    return path


def need_console_script(name: str) -> Path:
    """A console script of this package in the running virtual environment."""
    path = Path(sys.executable).with_name(name)
    if not path.exists():
        tool_missing(f"console script {name} is not installed (`make venv` installs it)")
    return path
