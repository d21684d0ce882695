"""A controller upgrade (or downgrade) as a chart upgrade does it, on a running embedded cluster: the CRDs of the
new release applied over the served ones, the running controller stopped (SIGTERM, its graceful end), the new
release started with the same flags.  The Rollouts, their ReplicaSets and the routes stay as the old controller
left them: what the new one does with them is what lane ``swap`` records."""
from __future__ import annotations

import time
from pathlib import Path

from ..core import config
from ..core.names import plain_name
from ..core.procs import pid_alive, terminate_proven
from ..toolchain import check_built, components_for
from ..core.wait import until
from .errors import ClusterError, ClusterInputError
from .snapshot import stamped_sha256
from .startup import crds_served
from ..core import fastyaml

CONTROLLER = "rollouts-controller"
STOP_GRACE_S = 20.0


def apply_crds(api, files: list[Path]) -> list[dict]:
    """Each CRD of ``files`` replaced (or created): what ``kubectl apply`` of a chart's crds/ leaves."""
    from ..kube.k8s import client
    from ..kube.k8s import ApiException
    ext = client.ApiextensionsV1Api(api)
    out = []
    for f in files:
        for doc in fastyaml.safe_load_all(Path(f).read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            name = doc["metadata"]["name"]
            try:
                cur = ext.read_custom_resource_definition(name)
                doc["metadata"]["resourceVersion"] = cur.metadata.resource_version
                ext.replace_custom_resource_definition(name, doc)
            except ApiException as e:
                if e.status != 404:
                    raise
                ext.create_custom_resource_definition(doc)
            spec = doc["spec"]
            out.append({"name": name, "group": spec["group"], "plural": spec["names"]["plural"],
                        "version": next(v["name"] for v in spec["versions"] if v.get("served"))})
    return out


def swap_controller(cluster, version: str, log=print, extra_args: list[str] = (), between=None) -> dict:
    """Replace the controller of ``cluster`` (an EmbeddedCluster that is up) by release ``version``, started with
    the flags of every start plus ``extra_args`` (a chart's controller.extraArgs); ``between(api)`` runs while no
    controller runs.  Returns what happened: from, to, the CRDs applied, the seconds of each phase, and the
    controller log's offset at the new start (what the new controller says comes after it)."""
    version = plain_name(config.normalise_version(version) or version, "controller version")
    st = cluster.state()
    if not st.get("ready"):
        raise ClusterInputError(f"cluster {cluster.name} is not up: nothing to swap")
    old = st.get("controller_version")
    missing = [c for c in components_for([version]) if c.name.startswith("rollouts") and not cluster.tc.is_built(c)]
    if missing:
        cluster.tc.ensure(missing)
    binary = cluster.tc.rollouts_dir(version) / CONTROLLER
    check_built(binary)
    crd_files = sorted((cluster.tc.rollouts_dir(version) / "crds").glob("*.yaml"))
    if not crd_files:
        raise ClusterError(f"no CRDs for {version} in {cluster.tc.rollouts_dir(version) / 'crds'}")
    api = cluster.api_client()
    t0 = time.monotonic()
    log(f"swap: applying the CRDs of {version} over those of {old}")
    crds = apply_crds(api, crd_files)
    until(f"the CRDs of {version} to be served", crds_served(api, crds), timeout=60, interval=0.1)
    t1 = time.monotonic()
    rec = next((p for p in cluster.process_records(st) if p["name"] == CONTROLLER), None)
    if rec is not None and pid_alive(rec["pid"]):     # none running: a swap that stopped half-way, being undone
        log(f"swap: stopping controller {old} (pid {rec['pid']}, SIGTERM)")
        if not terminate_proven(rec, cluster.marks(), grace=STOP_GRACE_S):
            raise ClusterError(f"the running {CONTROLLER} (pid {rec['pid']}) is not proven to be this cluster's: "
                               f"not signalled, not swapped")
        until(f"controller {old} to exit", lambda: not pid_alive(rec["pid"]), timeout=10, interval=0.05)
    cluster.unregister_process(CONTROLLER)
    if between is not None:
        between(api)
    t2 = time.monotonic()
    logfile = cluster.folder / "logs" / f"{CONTROLLER}.log"
    with open(logfile, "a") as f:
        f.write(f"\n=== drills: controller swapped {old} -> {version} at "
                f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n")
    offset = logfile.stat().st_size
    log(f"swap: starting controller {version}")
    cluster.start_controller(binary, list(extra_args))
    cluster.update_state(controller_version=version, controller_sha256=stamped_sha256(binary), swapped_from=old)
    t3 = time.monotonic()
    return {"from": old, "to": version, "args": list(extra_args), "crds": [c["name"] for c in crds], "log": str(logfile),
            "log_offset": offset, "seconds": {"crds": round(t1 - t0, 2), "stop": round(t2 - t1, 2),
                                              "start": round(t3 - t2, 2)}}
