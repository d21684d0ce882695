"""`drills scan` end to end on a fleet the size of the brief's (§2.3) and on 10,000 pre-rendered Rollouts.

    python benchmarks/bench_scan.py [--keep DIR] [--rollouts 10000] [--workers N]

1. Builds, in a temporary folder, a fleet in the fixture layout (fixtures/fleet: service charts on the base
   chart, five value layers, apps/<env>.yaml) with 228 apps -- prod 60, stage 60, int 57, int-1 51 -- whose
   charts carry 4 to 7 components each (aliases of the base chart): 1,364 application x component renders.
   Canary steps are drawn (seeded) in the brief's proportions: base inheritors, 77 `[100]`-alone, 48
   `steps: []`, `100 -> pause` forms, ramps, the incident's shape; some components off or without Istio.
   int and int-1 share their value files (int-1 is the third element of the stage matrix generator).
2. Times `python -m drills scan --fleet DIR` (helm renders included, with the progress bar).
3. Writes 10,000 Rollouts as pre-rendered manifests (100 files, with their Services and Istio objects) and
   times `python -m drills scan DIR`.
Targets (the issue): fleet <= 90 s on 2 cores; 10,000 pre-rendered Rollouts <= 10 s.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
BASE_SOURCES = ROOT / "fixtures" / "charts" / "base"
ENVS = {"prod": 60, "stage": 60, "int": 57, "int-1": 51}
ALIASES = ["api", "worker", "consumer", "cron", "admin", "events", "batch"]


def W(*xs):
    return [{"setWeight": x} if isinstance(x, int) else {"pause": {"duration": x} if x else {}} for x in xs]


SHAPES = [  # (weight, steps or None for an inheritor)
    (35, None), (6, W(100)), (4, []), (9, W(100, "10m")), (3, W(100, "3m")), (6, W(5, 100)), (4, W(1, 5, 100)),
    (4, W(10, 50, 100)), (4, W(5, "10m", 25, "10m", 80, 100)), (6, W(5, "10m")), (3, W(1, "5m", 5, "5m", 100)),
    (4, W(20, "5m", 100)), (4, W(10, "3m", 50, "5m", 100)), (4, W(25, None, 50, None)), (4, W(None, 100)),
]
REPLICAS = [1, 1, 2, 2, 2, 3, 3, 4, 6, 8, 12, 20, 40]


def components_per_service() -> list[int]:
    """Components per service so that the app x component count is 1,364 (see ENVS)."""
    counts = [6] * 60
    counts[0] = 5
    total = sum(c * sum(1 for n in ENVS.values() if s < n) for s, c in enumerate(counts))
    assert total == 1364, total
    return counts


def _dump(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def build_fleet(dest: Path, seed: int = 2026) -> dict:
    rnd = random.Random(seed)
    shapes = [s for w, s in SHAPES for _ in range(w)]
    counts = components_per_service()
    for env in ENVS:
        _dump(dest / "argo" / env / "defaults.yaml", {"base": {"rollout": {"analysis": {"enabled": env == "prod"}}}})
    n_components = 0
    for s, k in enumerate(counts):
        svc = f"svc-{s:02d}"
        aliases = ALIASES[:k]
        base_version = "3.0.14-rc.0" if s % 10 == 9 else "3.0.13"
        chart = {"apiVersion": "v2", "name": svc, "version": "1.0.0", "type": "application",
                 "dependencies": [{"name": "base", "alias": a, "version": base_version,
                                   "repository": f"file://{BASE_SOURCES / base_version}"} for a in aliases]}
        _dump(dest / "charts" / svc / "Chart.yaml", chart)
        _dump(dest / "charts" / svc / "values.yaml", {a: {"nameOverride": f"{svc}-{a}"} for a in aliases})
        layer2 = {}
        for a in aliases:
            c = {"image": {"repository": f"registry.local/{svc}-{a}", "tag": f"1.{s}.0"}}
            steps = rnd.choice(shapes)
            if steps is not None:
                c["rollout"] = {"canary": {"steps": steps}}
            if rnd.random() < 0.02:
                c.setdefault("rollout", {})["enabled"] = False
            if rnd.random() < 0.05:
                c["istioInject"] = False
            layer2[a] = c
        _dump(dest / "service" / svc / "values" / "values.yaml", layer2)
        for env in ("prod", "stage", "int"):
            layer3 = {a: {"rollout": {"canary": {"minPodsPerReplicaSet": rnd.choice([1, 2, 2, 2])}}} for a in aliases}
            _dump(dest / "platform" / "service-manager" / env / f"{svc}.yaml", layer3)
            _dump(dest / "service" / svc / "values" / f"{env}.yaml",
                  {a: {"replicas": rnd.choice(REPLICAS)} for a in aliases})
        for env, n in ENVS.items():
            if s >= n:
                continue
            files_env = "int" if env == "int-1" else env
            app = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                   "metadata": {"name": f"{svc}-{env}", "namespace": "argocd"},
                   "spec": {"project": env, "destination": {"namespace": svc},
                            "source": {"path": f"charts/{svc}", "helm": {"releaseName": svc, "valueFiles": [
                                f"service/{svc}/values/values.yaml",
                                f"platform/service-manager/{files_env}/{svc}.yaml",
                                f"service/{svc}/values/{files_env}.yaml", f"argo/{files_env}/defaults.yaml"]}}}}
            (dest / "apps").mkdir(parents=True, exist_ok=True)
            with open(dest / "apps" / f"{env}.yaml", "a") as f:
                f.write("---\n" + yaml.safe_dump(app, sort_keys=False))
            n_components += k
    return {"services": len(counts), "apps": sum(ENVS.values()), "app_x_component": n_components}


def build_manifests(fleet: Path, dest: Path, n: int) -> int:
    """`n` Rollouts as pre-rendered manifests: helm renders of a few apps, copied under new names."""
    sys.path.insert(0, str(ROOT))
    from drills.charts.helm import Helm
    from drills.charts.fleet import Fleet, Workspace
    docs = []
    with Helm() as helm, tempfile.TemporaryDirectory() as tmp:
        ws = Workspace(Fleet(fleet), Path(tmp) / "w", helm)
        for app in ws.apps("prod")[:6]:
            ws.update(app)
            text = helm.template(ws.chart_dir(app), app.name, app.namespace, ws.fleet.value_paths(app))
            docs += [d for d in text.split("\n---\n") if d.strip()]
    rollouts = [d for d in docs if "\nkind: Rollout\n" in d]
    others = [d for d in docs if "\nkind: Rollout\n" not in d]
    dest.mkdir(parents=True, exist_ok=True)
    written = 0
    per_file = 100
    for f in range(0, n, per_file):
        chunk = []
        for i in range(f, min(n, f + per_file)):
            src = rollouts[i % len(rollouts)]
            chunk.append(src.replace("name: svc-", f"name: r{i}-svc-"))
            chunk.append(others[i % len(others)].replace("name: svc-", f"name: r{i}-svc-"))
            written += 1
        (dest / f"rendered-{f // per_file:03d}.yaml").write_text("---\n" + "\n---\n".join(chunk) + "\n")
    return written


def timed_scan(args: list[str], as_json: bool = True) -> tuple[float, dict | str, str]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "drills", "scan", *args] + (["--json"] if as_json else []), cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    dt = time.monotonic() - t0
    if r.returncode not in (0, 1):
        raise SystemExit(f"drills scan {' '.join(args)}: exit {r.returncode}: {r.stderr[-2000:]}")
    return dt, (json.loads(r.stdout) if as_json else r.stdout), r.stderr


def load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", default=None, help="build into this folder and keep it")
    ap.add_argument("--rollouts", type=int, default=10000)
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-scan-"))
    if tmp.exists() and args.keep:
        shutil.rmtree(tmp)
    try:
        fleet = tmp / "fleet"
        t0 = time.monotonic()
        info = build_fleet(fleet)
        print(f"generated fleet: {info['apps']} apps ({', '.join(f'{e} {n}' for e, n in ENVS.items())}), "
              f"{info['app_x_component']} application x component renders, in {time.monotonic() - t0:.1f}s")
        extra = ["--workers", str(args.workers)] if args.workers else []
        dt, out, err = timed_scan(["--fleet", str(fleet), *extra])
        s, st = out["summary"], out["stats"]
        print(err.strip().splitlines()[-1] if err.strip() else "")
        print(f"fleet scan (helm renders included, JSON out): {dt:.1f}s wall on {os.cpu_count()} cores, {load()} "
              f"[target <= 90 s]: {st['fleet_apps']} app renders, {st['fleet_unique_renders']} unique by chart and "
              f"values digest, {st['fleet_charts']} charts vendored; {s['rollouts']} Rollouts, {s['exposed']} exposed, "
              f"waves {json.dumps(s['by_wave'])}")
        t0 = time.monotonic()
        n = build_manifests(fleet, tmp / "rendered", args.rollouts)
        print(f"wrote {n} pre-rendered Rollouts (with their Services/Istio objects) in {time.monotonic() - t0:.1f}s")
        dt_table, text, _ = timed_scan([str(tmp / "rendered")], as_json=False)
        dt, out, _ = timed_scan([str(tmp / "rendered")])
        assert f"{out['summary']['rollouts']} Rollouts, {out['summary']['exposed']} exposed" in text
        print(f"pre-rendered scan of {out['summary']['rollouts']} Rollouts ({out['stats']['manifest_files']} files, "
              f"{out['summary']['exposed']} exposed) [target <= 10 s]: {dt_table:.1f}s wall with the table, "
              f"{dt:.1f}s with --json; {load()}")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
