"""Lane B step 4: the first real deploy of an inheriting service after its base bump.

The service runs on base 3.0.13 in the cluster; its bumped render (3.0.14-rc.0) is applied as a sync
would.  The chart version sits in the pod template labels, so the bump is itself a deploy: the Rollout
walks the new default steps [5, pause 10m] (the long pause promoted through with a plain promote,
recorded), reaches 100 by the controller's own default after the last step, and is Healthy.
"""
from __future__ import annotations

import time
from pathlib import Path

from . import recorder, timeline
from .ledger import FAIL, NOT_APPLICABLE, PASS, Ledger
from .manifests import apply, docs
from .rollout import Predicate, Rollouts, healthy, paused

LANE = "b"
STEP = "first-deploy"


def _rollout_doc(text: str) -> dict:
    for d in docs(text):
        if d["kind"] == "Rollout":
            return d
    raise ValueError("the render has no Rollout")


def first_deploy(api, namespace: str, ws, app, candidate: str, ledger: Ledger, evidence_dir: Path,
                 audit_log: Path | None = None, log=None) -> list[dict]:
    log = log or (lambda m: print(m, flush=True))
    evidence_dir = Path(evidence_dir)
    evidence_dir.mkdir(parents=True, exist_ok=True)
    before = ws.render(app)
    name = _rollout_doc(before.text)["metadata"]["name"]
    rl = Rollouts(api, namespace, log=log)
    log(f"lane b: {app.name} running on base {before.base_version}")
    apply(api, namespace, before.text)
    ro = rl.wait(name, healthy(), 180)
    old_hash = ro["status"]["stableRS"]
    rec = recorder.Recorder(api, namespace, name, evidence_dir / "first-deploy.timeline.jsonl",
                            audit_log=audit_log).start()
    promotes = 0
    try:
        time.sleep(1.0)
        ws.bump(app, candidate)
        after = ws.render(app)
        new_steps = _rollout_doc(after.text)["spec"]["strategy"]["canary"]["steps"]
        applied = apply(api, namespace, after.text)
        rv = next((o["metadata"]["resourceVersion"] for o in applied if o["kind"] == "Rollout"), None)
        rec.mark("bump applied", rv=rv, base=candidate)
        log(f"lane b: applied the {candidate} render; steps {new_steps}")
        deadline = time.monotonic() + 300
        while True:
            ro = rl.wait(name, Predicate("Healthy at a new revision, or paused",
                                         lambda o: (healthy()(o) and o["status"].get("stableRS") != old_hash and
                                                    o["status"].get("stableRS") == o["status"].get("currentPodHash"))
                                         or paused()(o)), max(1.0, deadline - time.monotonic()))
            if ro["status"].get("phase") == "Healthy":
                break
            res = rl.promote_and_wait(name)
            promotes += 1
            rec.mark("promote", rv=(res or {}).get("metadata", {}).get("resourceVersion"),
                     step=ro["status"].get("currentStepIndex"))
            log(f"lane b: plain promote through the pause at step {ro['status'].get('currentStepIndex')}")
        end = time.monotonic() + 20
        while time.monotonic() < end:
            d = timeline.derive(list(rec.records), None, since_mark="bump applied")
            if d.canary_weight and d.canary_weight[-1][1] == 0 and any(w == 100 for _, w in d.canary_weight):
                break
            time.sleep(0.1)
    finally:
        result = rec.stop()
    d = timeline.derive(rec.records, ro["status"]["stableRS"], since_mark="bump applied", target="rs_spec")
    series = timeline.series_path(rec.out)
    import json
    series.write_text(json.dumps(d.series(f"lane b first deploy of {app.name} on base {candidate}"), indent=1))
    marks = {label: t for t, label in d.markers}
    weights = [[round(t - d.t0, 2), w] for t, w in d.canary_weight]
    t_promote = marks.get("promote")
    before_promote = [w for t, w in d.canary_weight if t_promote is None or t < t_promote]
    after_promote = [w for t, w in d.canary_weight if t_promote is not None and t >= t_promote]
    new_hash = ro["status"]["stableRS"]
    ev = str(rec.out)
    rows = [
        ledger.record(LANE, STEP, "the bump is itself a deploy (chart version in the pod template labels)",
                      "new pod-template-hash", f"{old_hash} -> {new_hash}",
                      PASS if new_hash != old_hash else FAIL, evidence=ev, app=app.name),
        ledger.record(LANE, STEP, "the deployed Rollout walks the inherited steps (final setWeight removed)",
                      "5,pause:10m", _steps_text(new_steps), PASS if new_steps == [
                          {"setWeight": 5}, {"pause": {"duration": "10m"}}] else FAIL, evidence=ev, app=app.name),
        ledger.record(LANE, STEP, "canary weight during the ramp (before the 10m pause is promoted)", 5,
                      max(before_promote) if before_promote else None,
                      PASS if before_promote and max(before_promote) == 5 else FAIL, evidence=ev,
                      weights=weights, plain_promotes=promotes, recorder=result),
        ledger.record(LANE, STEP, "canary weight 100 after the last step, by the controller's own default", 100,
                      max(after_promote) if after_promote else None,
                      PASS if after_promote and max(after_promote) == 100 and result["complete"] else FAIL,
                      evidence=ev, weights=weights),
        ledger.record(LANE, STEP, "Healthy at the new revision", "Healthy", ro["status"].get("phase"),
                      PASS if ro["status"].get("phase") == "Healthy" else FAIL, evidence=ev),
        ledger.record(LANE, STEP, "background analysis during the first deploy", "analysis runs",
                      "off in the stage values layer", NOT_APPLICABLE,
                      reason="the stage values layer turns analysis off: lane B runs no Prometheus"),
    ]
    return rows


def _steps_text(steps) -> str:
    from .probe import steps_text
    return steps_text(steps)
