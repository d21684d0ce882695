"""What the toolchain builds: components (module, version, binaries, flags), the controller versions a run
asks for, and the wrapper go.mod generated from each target's own go.mod."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

from ..core import config
from ..core.errors import BadInput
from ..core.procs import run_bounded


class BuildError(RuntimeError):
    """A component failed to build; the message names module, version and Go's error."""


class UnknownVersion(BadInput, ValueError):
    """Not a version string, or not served by the Go module proxy."""


class GoMissing(BadInput):
    """No `go` command on PATH: nothing can be built."""


def require_go() -> str:
    go = shutil.which("go")
    if not go:
        raise GoMissing("the go command is not on PATH: drills builds its binaries from Go modules; install Go "
                        f"(>= 1.26) or put it on PATH (cache: {config.cache_dir()})")
    return go


@dataclass(frozen=True)
class Component:
    name: str                      # cache folder name: kubernetes, kwok, etcd, helm, rollouts, ...
    module: str                    # Go module the wrapper requires
    version: str                   # module version
    binaries: dict = field(default_factory=dict)   # output name -> package path
    ldflags: tuple = ()
    extra: str | None = None       # post-build step: "rollouts", "kwok", "istio"
    tags: tuple = ()               # Go build tags

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"


def _k8s_ldflags(v: str) -> tuple:
    major, minor, _ = config.version_tuple(v)
    pkg = "k8s.io/component-base/version"
    return (f"-X {pkg}.gitVersion={v}", f"-X {pkg}.gitMajor={major}", f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean")


def rollouts_component(version: str) -> Component:
    bare = version.lstrip("v")
    return Component(
        name="rollouts", module=config.ROLLOUTS_MODULE, version=version,
        binaries={"rollouts-controller": f"{config.ROLLOUTS_MODULE}/cmd/rollouts-controller",
                  "kubectl-argo-rollouts": f"{config.ROLLOUTS_MODULE}/cmd/kubectl-argo-rollouts"},
        ldflags=(f"-X {config.ROLLOUTS_MODULE}/utils/version.version={bare}",),
        extra="rollouts",
    )


def user_built_component(release: str, reported: str, commit: str | None = None) -> Component:
    """A rollouts-controller built from a release's module that reports another version string, as a build
    of a source tree whose version file is stale does (upstream's Makefile passes ``-X
    .../utils/version.version=$(cat VERSION)``).  With ``commit`` (40 hex digits) it is stamped as the Makefile
    stamps a clean checkout's HEAD (``gitCommit``, ``gitTreeState=clean``): it then says ``v1.2.0+<7 of them>``.
    Cached apart from the release, under the reported string (and the commit)."""
    if not re.fullmatch(r"[0-9A-Za-z][0-9A-Za-z.+-]*", reported or ""):
        raise ValueError(f"not a version string a controller could report: {reported!r}")
    if commit is not None and not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise ValueError(f"not a commit (40 hex digits): {commit!r}")
    base = rollouts_component(release)
    stamp = (f"-X {config.ROLLOUTS_MODULE}/utils/version.gitCommit={commit}",
             f"-X {config.ROLLOUTS_MODULE}/utils/version.gitTreeState=clean") if commit else ()
    return Component(
        name=f"rollouts-reporting-{reported}" + (f"-{commit[:12]}" if commit else ""), module=base.module,
        version=release, binaries={"rollouts-controller": base.binaries["rollouts-controller"]},
        ldflags=(f"-X {config.ROLLOUTS_MODULE}/utils/version.version={reported}", *stamp))


def base_components() -> list[Component]:
    k = config.KUBERNETES_VERSION
    return [
        Component("etcd", "go.etcd.io/etcd/server/v3", config.ETCD_VERSION,
                  {"etcd": "go.etcd.io/etcd/server/v3"}),
        Component("kwok", "sigs.k8s.io/kwok", config.KWOK_VERSION,
                  {"kwok": "sigs.k8s.io/kwok/cmd/kwok", "kwokctl": "sigs.k8s.io/kwok/cmd/kwokctl"},
                  extra="kwok"),
        Component("kubernetes", "k8s.io/kubernetes", k,
                  {n: f"k8s.io/kubernetes/cmd/{n}" for n in
                   ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")},
                  ldflags=_k8s_ldflags(k)),
        Component("helm", "helm.sh/helm/v3", config.HELM_VERSION, {"helm": "helm.sh/helm/v3/cmd/helm"},
                  ldflags=(f"-X helm.sh/helm/v3/internal/version.version={config.HELM_VERSION}",)),
        Component("istio-crds", "istio.io/api", config.ISTIO_API_VERSION, {}, extra="istio"),
    ]


def optional_components() -> dict[str, Component]:
    return {
        "registry": Component("registry", "github.com/distribution/distribution/v3", config.REGISTRY_VERSION,
                              {"registry": "github.com/distribution/distribution/v3/cmd/registry"}),
        "prometheus": Component(
            "prometheus", "github.com/prometheus/prometheus", config.PROMETHEUS_VERSION,
            {"prometheus": "github.com/prometheus/prometheus/cmd/prometheus",
             # the rule checker and unit tester (`promtool check rules`, `promtool test rules`) of drills alerts
             "promtool": "github.com/prometheus/prometheus/cmd/promtool"},
            ldflags=(f"-X github.com/prometheus/common/version.Version={config.PROMETHEUS_VERSION.lstrip('v')}",),
            # drills' Prometheus scrapes static targets only: without the service-discovery plugins (cloud SDKs,
            # client-go) it builds in about half the time; promtool's rule checks and unit tests do not use them
            tags=("remove_all_sd",)),
        # the weight, step and phase of each Rollout for the alert rules (custom-resource-state metrics)
        "kube-state-metrics": Component(
            "kube-state-metrics", "k8s.io/kube-state-metrics/v2", config.KUBE_STATE_METRICS_VERSION,
            {"kube-state-metrics": "k8s.io/kube-state-metrics/v2"},
            ldflags=("-X github.com/prometheus/common/version.Version="
                     f"{config.KUBE_STATE_METRICS_VERSION.lstrip('v')}",)),
    }


def resolve_controller_versions(spec: str | list[str] | None, check_served: bool = True) -> list[str]:
    """'v1.8.2,1.10.2' / 'all' / None -> normalised versions.  Raises UnknownVersion."""
    if spec is None or spec == "":
        return [config.DEFAULT_CONTROLLER]
    items = spec if isinstance(spec, list) else [s for s in spec.split(",") if s.strip()]
    out: list[str] = []
    for item in items:
        item = item.strip()
        if item == "all":
            out.extend(v for v in config.SUPPORTED_CONTROLLERS if v not in out)
            continue
        v = config.normalise_version(item)
        if v is None:
            raise UnknownVersion(f"unknown controller version {item!r}: not a version string. "
                                 f"Tested versions: {', '.join(config.SUPPORTED_CONTROLLERS)}")
        if v not in config.SUPPORTED_CONTROLLERS and check_served and not _module_served(config.ROLLOUTS_MODULE, v):
            raise UnknownVersion(f"unknown controller version {v}: the Go module proxy does not serve "
                                 f"{config.ROLLOUTS_MODULE}@{v}. Tested versions: "
                                 f"{', '.join(config.SUPPORTED_CONTROLLERS)}")
        if v not in out:
            out.append(v)
    return out


SERVED_TIMEOUT_S = 300         # go mod download of a version drills does not know yet


def _module_served(module: str, version: str) -> bool:
    require_go()
    env = dict(os.environ, GOTOOLCHAIN="local", GOFLAGS="-mod=mod")
    try:
        r = run_bounded(["go", "mod", "download", "-json", f"{module}@{version}"], timeout=SERVED_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        raise UnknownVersion(f"controller version {version}: go mod download {module}@{version} did not finish "
                             f"within {SERVED_TIMEOUT_S}s, so whether the Go module proxy serves it is unknown "
                             f"(module proxy unreachable?)") from None
    try:
        info = json.loads(r.stdout)
    except ValueError:
        return False
    err = info.get("Error", "")
    # "requires go >= X" still means the module is served.
    return bool(info.get("GoMod")) and (not err or "requires go" in err)


def components_for(controllers: list[str], extras: list[str] = ()) -> list[Component]:
    """What a cluster at these controller versions needs (and ``extras``), in the order a cold machine should build
    them, two at a time (drills.toolchain.locks.build_jobs): etcd beside Kubernetes (the longest of the first
    cluster's builds, so it starts at once), then kwok, the Istio CRDs and the first controller while Kubernetes
    still builds (the first cluster can start when both are done), then helm (every chart render and fleet scan
    waits for it), the other controllers and the optional components."""
    base = {c.name: c for c in base_components()}
    opt = optional_components()
    rollouts = [rollouts_component(v) for v in controllers]
    first = [base["etcd"], base["kubernetes"], base["kwok"], base["istio-crds"]]
    return first + rollouts[:1] + [base["helm"]] + rollouts[1:] + [opt[e] for e in extras]


# ---------------------------------------------------------------------------------------------

_REQ_RE = re.compile(r"^\s*([^\s]+)\s+(v[^\s]+)")


def parse_gomod(text: str) -> dict:
    """Minimal go.mod reader: go directive, requires, replaces."""
    go = None
    requires: dict[str, str] = {}
    replaces: list[tuple[str, str | None, str, str | None]] = []
    block = None
    for raw in text.splitlines():
        line = raw.split("//", 1)[0].strip()
        if not line:
            continue
        if block:
            if line == ")":
                block = None
                continue
            body = line
        else:
            word, _, body = line.partition(" ")
            body = body.strip()
            if word == "go":
                go = body
                continue
            if word in ("require", "replace"):
                if body == "(":
                    block = word
                    continue
                block_once = word
                _apply(block_once, body, requires, replaces)
                continue
            continue
        _apply(block, body, requires, replaces)
    return {"go": go, "require": requires, "replace": replaces}


def _apply(kind, body, requires, replaces):
    if kind == "require":
        m = _REQ_RE.match(body)
        if m:
            requires[m.group(1)] = m.group(2)
    elif kind == "replace":
        left, _, right = body.partition("=>")
        lp = left.split()
        rp = right.split()
        if not lp or not rp:
            return
        replaces.append((lp[0], lp[1] if len(lp) > 1 else None, rp[0], rp[1] if len(rp) > 1 else None))


def wrapper_gomod(comp: Component, target: dict) -> str:
    """The wrapper module's go.mod: require the target and repeat its replace block.

    Relative (directory) replaces cannot be followed from a module zip: they become a replace to the
    published module at the version the target requires, or, for Kubernetes' v0.0.0 staging
    placeholders, at v0.<minor>.<patch> of the Kubernetes version.  Replaces of modules the target
    does not require (guards such as FORBIDDEN_DEPENDENCY) are dropped.
    """
    lines = ["module drills.local/build/" + re.sub(r"[^A-Za-z0-9]+", "-", comp.key), ""]
    if target.get("go"):
        lines.append(f"go {target['go']}")
        lines.append("")
    lines.append(f"require {comp.module} {comp.version}")
    lines.append("")
    reps = []
    for old, old_v, new, new_v in target["replace"]:
        if new.startswith(".") or new.startswith("/"):
            req = target["require"].get(old)
            if req is None:
                continue
            if req.startswith("v0.0.0") and comp.module == "k8s.io/kubernetes":
                _, minor, patch = config.version_tuple(comp.version)
                req = f"v0.{minor}.{patch}"
            reps.append(f"\t{old} => {old} {req}")
        else:
            left = f"{old} {old_v}" if old_v else old
            right = f"{new} {new_v}" if new_v else new
            reps.append(f"\t{left} => {right}")
    if reps:
        lines.append("replace (")
        lines.extend(reps)
        lines.append(")")
    return "\n".join(lines) + "\n"
