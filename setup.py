"""The wheel carries the built-in data: the checkout's fixtures/ (the lanes' data, charts, the fixture fleet,
locustfiles, load thresholds, upgrade directions) and lanes/ (the lanes' pytest files) are copied into the
package as drills/_data/ when the wheel is built, so the checkout keeps one copy of each file.  An installed
drills reads them there (drills.core.config.data_root); a checkout reads its own folders.  The build also records the
commit it was built from (drills/_data/build.json), which `drills version` shows outside a checkout."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent
DATA = ("fixtures", "lanes")          # checkout folders the package carries under drills/_data/


def _commit() -> str | None:
    """The commit of the checkout being built: $DRILLS_BUILD_COMMIT when set (a build from a copy without .git, as
    the Containerfile's), else the checkout's HEAD; None for a build from a source distribution."""
    if os.environ.get("DRILLS_BUILD_COMMIT"):
        return os.environ["DRILLS_BUILD_COMMIT"]
    try:
        r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--show-toplevel", "HEAD"], capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = r.stdout.split()
    if r.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != ROOT:
        return None
    return lines[1]


def copy_data(build_lib: str) -> None:
    """The built-in data into the package being built (drills/_data/), and the build record."""
    dest = Path(build_lib) / "drills" / "_data"
    shutil.rmtree(dest, ignore_errors=True)       # a stale copy of an earlier build never ships
    for name in DATA:
        shutil.copytree(ROOT / name, dest / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"))
    (dest / "build.json").write_text(json.dumps({"commit": _commit()}) + "\n")


if __name__ == "__main__":          # the build backend runs this file as __main__; tests import it for _commit
    from setuptools import setup
    from setuptools.command.build_py import build_py

    class BuildWithData(build_py):
        def run(self):
            super().run()
            if not getattr(self, "editable_mode", False):      # an editable install reads the checkout's folders
                copy_data(self.build_lib)

    setup(cmdclass={"build_py": BuildWithData})
