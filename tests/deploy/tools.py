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

import pytest


def need_tool(name: str) -> str:
    """The tool's path, or skip (fail under RAILOVER_REQUIRE_TOOLS=1) when it is missing."""
    # The virtual environment's scripts (kubernetes-validate) first, then PATH.
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    path = shutil.which(name, path=search)
    if path is None:
        message = f"{name} is not installed (`make test` installs it)"
        if os.environ.get("RAILOVER_REQUIRE_TOOLS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path
