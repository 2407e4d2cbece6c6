"""Write the OpenAPI document generated from the app (`make openapi`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from scheduler_svc.main import create_app


def render() -> str:
    return json.dumps(create_app().openapi(), indent=2, sort_keys=True) + "\n"


def main() -> None:
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("openapi/openapi.json")
    target.write_text(render())
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
