"""Print pyproject.toml's runtime dependencies (and the ``hub`` extra's) pinned at their lower
bounds, as pip constraints.

pip installs the newest releases, so a lower bound that went false (pytest 8.4.0 crashed every
run) shows only where something installs the lowest: .ci/run's second virtualenv does, with
these pins. Every one of them must have a ``>=`` bound for it.
"""

import re
import sys
import tomllib
from pathlib import Path

pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
project = tomllib.loads(pyproject.read_text())["project"]
for spec in project["dependencies"] + project.get("optional-dependencies", {}).get("hub", []):
    bound = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9][0-9A-Za-z.]*)", spec)
    if bound is None:
        sys.exit(f"{pyproject}: dependency {spec!r} has no plain '>=' lower bound to pin")
    print(f"{bound[1]}=={bound[2]}")
