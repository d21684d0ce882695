"""Settings: pinned versions, cache location, defaults.

Every pinned version of every component lives here and nowhere else.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from .names import plain_name

# --- pinned component versions (built from Go modules only) -----------------
KUBERNETES_VERSION = "v1.36.3"
KWOK_VERSION = "v0.8.0"
ETCD_VERSION = "v3.6.16"
HELM_VERSION = "v3.19.5"
ISTIO_API_VERSION = "v1.32.0"
REGISTRY_VERSION = "v3.1.2"
PROMETHEUS_VERSION = "v0.316.0"
KUBE_STATE_METRICS_VERSION = "v2.20.0"

# Go toolchain for modules that declare a newer go directive than the machine's.
NEWER_GO_TOOLCHAIN = "go1.27.3"

# --- Argo Rollouts ------------------------------------------------------------
ROLLOUTS_MODULE = "github.com/argoproj/argo-rollouts"
SUPPORTED_CONTROLLERS = ("v1.7.1", "v1.7.2", "v1.8.2", "v1.8.5", "v1.9.3", "v1.10.2")
DEFAULT_CONTROLLER = "v1.8.2"
# the Argo API's names, spelled once
ARGO_GROUP, ARGO_VERSION = "argoproj.io", "v1alpha1"
ARGO_API_VERSION = f"{ARGO_GROUP}/{ARGO_VERSION}"
# the command line's vocabulary that modules below it read too (here: the command line reads it without them)
VARIANT_MODES = ("stage", "prod", "both")                # lane A's fixture per leg: stage, prod or both
PROBE_AFTER_WINDOW, PROBE_ONE_BY_ONE = "after-window", "one-by-one"   # how a probe releases the revived pods
HASH_LABEL = "rollouts-pod-template-hash"                # the controller's label on a revision's RS and pods
REVISION_ANNOTATION = "rollout.argoproj.io/revision"
# The versions the README's test command exercises.
TEST_CONTROLLERS = ("v1.8.2", "v1.10.2")
# the controller upgrade the fleet plans (brief): lane swap runs it beside the neighbouring pairs
FLEET_UPGRADE = ("v1.8.2", "v1.10.2")

VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(-[0-9A-Za-z.-]+)?$")


def normalise_version(text: str) -> str | None:
    """'1.8.2', 'v1.8.2', 'v1.8.2+unknown' -> 'v1.8.2'; None when not a version."""
    text = text.strip().split("+", 1)[0]
    m = VERSION_RE.match(text)
    if not m:
        return None
    return "v" + text.lstrip("v")


def version_tuple(v: str) -> tuple[int, int, int]:
    m = VERSION_RE.match(v)
    if not m:
        raise ValueError(f"not a version: {v!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


_VERSION_PREFIX = re.compile(r"v?(\d+)\.(\d+)\.(\d+)")


def version_key(v) -> tuple:
    """Release order for a version or a controller label ("v1.10.2", "v1.8.2+unknown", "v1.8.2 (abc123)"): by the
    numbers, never as text (v1.10.2 after v1.8.2); what has no version number sorts last, by its text."""
    m = _VERSION_PREFIX.match(str(v))
    return (0, tuple(int(x) for x in m.groups()), str(v)) if m else (1, (0, 0, 0), str(v))


def version_order(versions) -> list[str]:
    """The versions (or labels) in release order (``version_key``)."""
    return sorted(versions, key=version_key)


def swap_pairs(versions) -> list[tuple[str, str]]:
    """Lane swap's pairs among ``versions``: each to the next in release order (the neighbouring upgrades), then
    the upgrade the fleet plans (FLEET_UPGRADE) when both of its versions are among them."""
    ordered = version_order(dict.fromkeys(versions))
    pairs = list(zip(ordered, ordered[1:]))
    if set(FLEET_UPGRADE) <= set(ordered) and FLEET_UPGRADE not in pairs:
        pairs.append(FLEET_UPGRADE)
    return pairs


def cache_dir() -> Path:
    return Path(os.environ.get("DRILLS_CACHE") or Path.home() / ".cache" / "drills").expanduser()


def clusters_dir() -> Path:
    return cache_dir() / "clusters"


PACKAGE = Path(__file__).resolve().parent.parent       # drills/ (this module is drills/core/config.py)


def project_root() -> Path:
    return PACKAGE.parent


def checkout_root() -> Path | None:
    """The checkout this package runs from (its pyproject.toml and fixtures/ beside it), or None for an
    installed package (a wheel in site-packages)."""
    root = project_root()
    return root if (root / "pyproject.toml").is_file() and (root / "fixtures" / "lanes").is_dir() else None


def data_root() -> Path:
    """Where the built-in data lives: the checkout's fixtures/ and lanes/, or, installed, the copies the wheel
    carries in drills/_data/ (setup.py copies them at build time)."""
    return checkout_root() or PACKAGE / "_data"


def fixtures_dir() -> Path:
    """The built-in data: the lanes' data, charts, the fixture fleet, locustfiles, load thresholds."""
    return data_root() / "fixtures"


def lanes_dir() -> Path:
    """The built-in lanes' pytest files (lanes/<key>/)."""
    return data_root() / "lanes"


def data_path(given: str | None) -> str | None:
    """A path as given; a relative ``fixtures/...`` that names nothing here is the built-in data of that name (the
    README's ``--fleet fixtures/fleet`` works outside a checkout too).  Anything else is the user's own path."""
    if not given or Path(given).exists() or Path(given).is_absolute() or Path(given).parts[:1] != ("fixtures",):
        return given
    builtin = fixtures_dir().joinpath(*Path(given).parts[1:])
    return str(builtin) if builtin.exists() else given


def reports_dir() -> Path:
    """Where run folders go: $DRILLS_REPORTS (``--reports-dir`` sets it), else ./reports of the working
    directory; never inside the installed package."""
    return Path(os.environ.get("DRILLS_REPORTS") or Path.cwd() / "reports").absolute()


def user_config_file() -> Path:
    return Path(os.environ.get("DRILLS_CONFIG") or Path.home() / ".config" / "drills" / "config.yaml")


# --- drill defaults -------------------------------------------------------------
EMBEDDED_CLUSTER_NAME = "drills"          # the default cluster; $DRILLS_CLUSTER names another
NAMESPACE_OPT_IN_LABEL = "drills.dev/allow"
DEFAULT_POD_READY_DELAY = 1.0        # seconds an unheld pod waits before Ready
DEFAULT_HOLD_SECONDS = 15.0          # per pod under a hold


def cluster_name(name: str | None = None) -> str:
    """The embedded cluster's name: ``name``, else $DRILLS_CLUSTER, else the default; a plain name (it is a folder
    of the cache), else BadName (exit 2) before anything is touched."""
    given = name or os.environ.get("DRILLS_CLUSTER")
    return plain_name(given, "cluster name" if name else "DRILLS_CLUSTER") if given else EMBEDDED_CLUSTER_NAME
