"""How often a controller misses a plain promote sent the moment it pauses, per controller version.

    DRILLS_CLUSTER=NAME python benchmarks/bench_promote_race.py --controller v1.9.3 [--rollouts 4] [--cycles 10]
        [--act-within 20] [--resend]

Each Rollout (steps [setWeight 50, pause {}], 2 replicas) is deployed again and again; as soon as a watch
shows it Paused at step 1, the plain promote the plugin sends (``{"status":{"pauseConditions":null}}``,
under the resourceVersion read) goes out at once, and the script waits ``--act-within`` seconds for the
controller to take it (``drills.kube.rollout.promote_taken``).  A promote not taken is printed with what etcd
holds, the resourceVersion of the promote's response, and the resourceVersions the controller reconciled
from afterwards (its log: "Started syncing rollout ... resourceVersion=N"): a controller whose informer
cache went back to an object older than the promote keeps reconciling that older resourceVersion.  The
stalled Rollout is then promoted again as the plugin would (``--resend``), or left for inspection.
"""
from __future__ import annotations

import argparse
import re
import sys
import threading
import time
from pathlib import Path

from kubernetes import client

from drills.core import config
from drills.drill.safety import NAMESPACE_LABEL_VALUE
from drills.cluster import EmbeddedCluster
from drills.drill.shapes import RolloutSpec as ProbeSpec, install
from drills.kube.rollout import Predicate, WaitTimeout, healthy, paused, promote_taken, summarize_rollout

STEPS = [{"setWeight": 50}, {"pause": {}}]
_LINE_RE = re.compile(r'msg="Started syncing rollout".*?resourceVersion=(\d+).*?rollout=(\S+)')


def synced_versions(log: Path, name: str, offset: int) -> list[int]:
    """resourceVersions the controller started reconciling ``name`` from, in its log after ``offset``."""
    with open(log, "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    return [int(m.group(1)) for m in _LINE_RE.finditer(text) if m.group(2).strip('"') == name]


def cycle(ro, name: str, image: str, act_within: float, log: Path, resend: bool) -> dict:
    ro.set_image(name, image)
    at_pause = ro.wait(name, Predicate("paused at step 1", lambda o: paused()(o) and
                                       o["status"].get("currentStepIndex") == 1), 120)
    offset = log.stat().st_size
    t0 = time.monotonic()
    res = ro.promote(name)
    out = {"rollout": name, "image": image, "paused_rv": int(at_pause["metadata"]["resourceVersion"]),
           "promote_rv": int((res or {}).get("metadata", {}).get("resourceVersion") or 0)}
    try:
        ro.wait(name, promote_taken(1), act_within)
        out["taken_after_s"] = round(time.monotonic() - t0, 3)
    except WaitTimeout:
        cur = ro.get(name)
        st = cur.get("status") or {}
        out.update(taken_after_s=None, stored=summarize_rollout(cur), stored_rv=int(cur["metadata"]["resourceVersion"]),
                   pause_conditions=st.get("pauseConditions"), controller_pause=st.get("controllerPause"),
                   reconciled_rvs=synced_versions(log, name, offset))
        if not resend:
            return out
        again = ro.promote(name)          # the plugin's request from the state now stored
        out["resent_rv"] = int((again or {}).get("metadata", {}).get("resourceVersion") or 0)
    ro.wait(name, Predicate("Healthy", lambda o: healthy()(o) and o["status"].get("stableRS") ==
                            o["status"].get("currentPodHash")), 120)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--controller", default=config.DEFAULT_CONTROLLER)
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--cycles", type=int, default=10)
    ap.add_argument("--act-within", type=float, default=20.0)
    ap.add_argument("--resend", action="store_true", help="promote a stalled Rollout again and go on")
    args = ap.parse_args()
    cluster = EmbeddedCluster()
    st = cluster.up(args.controller)
    log = Path(next(p["log"] for p in st["processes"] if p["name"] == "rollouts-controller"))
    api = cluster.api_client()
    ns = f"promote-race-{int(time.time())}"
    client.CoreV1Api(api).create_namespace(
        {"metadata": {"name": ns, "labels": {config.NAMESPACE_OPT_IN_LABEL: NAMESPACE_LABEL_VALUE}}})
    names = [f"race{i}" for i in range(args.rollouts)]
    ros = {}
    for n in names:
        ros[n] = install(api, ns, ProbeSpec(steps=STEPS, replicas=2, min_pods=1, name=n, rollback_window=None,
                                            image_v1=f"registry.local/{n}:v0"))
    for n in names:
        ros[n].wait(n, healthy(), 120)
    results: list[dict] = []
    lock = threading.Lock()

    def run(n):
        for c in range(1, args.cycles + 1):
            try:
                r = cycle(ros[n], n, f"registry.local/{n}:v{c}", args.act_within, log, args.resend)
            except Exception as e:     # a cycle that broke for another reason is counted apart
                r = {"rollout": n, "error": f"{type(e).__name__}: {e}"}
            with lock:
                results.append(r)
                print(f"  {n} cycle {c}: " + (f"taken in {r['taken_after_s']}s" if r.get("taken_after_s") is not None
                                              else f"NOT TAKEN {r}"), flush=True)
            if r.get("taken_after_s") is None and not args.resend:
                return

    threads = [threading.Thread(target=run, args=(n,)) for n in names]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    taken = [r["taken_after_s"] for r in results if r.get("taken_after_s") is not None]
    stalled = [r for r in results if "error" not in r and r.get("taken_after_s") is None]
    errors = [r for r in results if "error" in r]
    median = sorted(taken)[len(taken) // 2] if taken else 0.0
    print(f"controller {args.controller}: {len(results)} promotes in {time.monotonic() - t0:.0f}s, "
          f"{len(stalled)} not taken within {args.act_within:.0f}s, {len(errors)} cycles broke otherwise; "
          f"taken after (s): max {max(taken, default=0.0):.2f}, median {median:.2f}")
    for r in stalled:
        print(f"  not taken: {r['rollout']} paused at rv {r['paused_rv']}, promote rv {r['promote_rv']}, etcd rv "
              f"{r['stored_rv']} ({r['stored']}; pauseConditions={r['pause_conditions']}, controllerPause="
              f"{r['controller_pause']}); the controller reconciled from rv {sorted(set(r['reconciled_rvs']))} "
              f"after the promote")
    for r in errors:
        print(f"  broke: {r}")
    print(f"namespace {ns}; controller log {log}")
    return 1 if stalled else 0


if __name__ == "__main__":
    sys.exit(main())
