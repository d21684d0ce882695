"""The answer a person and a CI gate act on, on recorded ledgers (no cluster): ids and polarities, the headline per
controller first in the console, the run report, the matrix and `drills report --json`, old ledgers without ids,
a user-built controller's rows (observations only) and name, the provenance of every row."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from drills.record import answer
from drills.core import config
from drills.reporting import console
from drills.traffic import load
from drills.drill.controller_binary import inspect_binary
from drills.record.ledger import FAIL, HAZARD, HOLDS, NEUTRAL, PASS, UNVERIFIED, Ledger, read_rows
from drills.reporting.report import write_matrix, write_run_report
from drills.reporting.upgrade import classify, exit_code

from test_upgrade import _one_run_folder, ledger_of, record_lane_a, release

NEW_FIELDS = ("id", "polarity", "shows", "fact", "condition", "drills_version", "drills_commit", "kubernetes_version")


def drills(*args, env=None):
    return subprocess.run([sys.executable, "-m", "drills", *args], capture_output=True, text=True, timeout=300,
                          cwd=str(config.project_root()), env={**os.environ, **(env or {})})


def legacy(rows: list[dict]) -> list[dict]:
    """The rows as a ledger recorded before ids and polarities existed."""
    return [{k: v for k, v in r.items() if k not in NEW_FIELDS} for r in rows]


# --- ids, polarity, the headline ------------------------------------------------------------------------------
def test_every_row_has_a_stable_id_a_polarity_and_its_provenance(tmp_path):
    rows = ledger_of(tmp_path, "v1.8.2", release("v1.8.2"))
    by = {r["id"]: r for r in rows}
    assert by["a/before/peak-weight"]["polarity"] == HAZARD and by["a/before/peak-weight"]["shows"] is True
    assert by["a/after/peak-weight"]["polarity"] == HOLDS and by["a/after/peak-weight"]["shows"] is True
    assert by["a/before/load.exposure.failure_ratio"]["polarity"] == HAZARD
    assert by["a/before/load.steady.p95_ms"]["polarity"] == NEUTRAL and by["a/before/load.steady.p95_ms"]["shows"] is None
    assert by["order/hazard-replica-progress-threshold/peak-weight"]["shows"] is None      # not applicable
    for r in rows:
        assert re.fullmatch(r"[a-z]+/[a-z-]+/[a-z0-9._-]+", r["id"]), r["id"]
        assert r["drills_version"] and r["kubernetes_version"] == config.KUBERNETES_VERSION
        assert r["drills_commit"] is None or re.fullmatch(r"[0-9a-f]{40}(-dirty)?", r["drills_commit"])
    with pytest.raises(ValueError, match="unknown polarity"):
        Ledger(tmp_path / "x", "x", "embedded", "v1.8.2").record("a", "s", "t", 1, 1, PASS, polarity="good")


def test_the_headline_says_whether_the_prescription_holds_from_the_holds_and_hazard_rows(tmp_path):
    rows = ledger_of(tmp_path, "v1.8.2", release("v1.8.2")) + \
        ledger_of(tmp_path, "v1.10.2", release("v1.10.2", hazard=100))
    h182, h1102 = answer.headlines(rows)
    assert h182["text"] == "prescription holds on v1.8.2: yes (BEFORE 100 on 1 of 2 pods → AFTER 5; exit Healthy)"
    assert h1102["text"] == ("prescription holds on v1.10.2: yes (BEFORE 100 on 1 of 2 pods → AFTER 5; exit Healthy), "
                             "except with replicaProgressThreshold {type: Pods} (100)")
    assert [e["evidence"] for e in h182["evidence"]] == ["before.timeline.jsonl", "after.timeline.jsonl",
                                                         "exit.timeline.jsonl"]
    assert h1102["except"][0]["evidence"] == "order-hazard.timeline.jsonl"
    # the prescription failing: AFTER above the last rung is a "no", whatever the row's verdict
    bad = answer.headline(ledger_of(tmp_path / "bad", "v1.8.2", release("v1.8.2", after=100)))
    assert bad["holds"] == answer.NO and bad["text"].startswith(
        "prescription holds on v1.8.2: no: AFTER 100 on 1 of 2 pods (BEFORE 100 on 1 of 2 pods; exit Healthy)"), bad
    # no lane that answers it (lane abort only): said, never a yes
    only_abort = answer.headline([r for r in rows if r["lane"] == "abort" and r["controller_version"] == "v1.8.2"])
    assert only_abort["holds"] == answer.UNANSWERED


def test_old_ledgers_without_ids_pair_by_the_sentence_and_keep_their_answer(tmp_path):
    base = ledger_of(tmp_path, "v1.8.2", release("v1.8.2"))
    cand = ledger_of(tmp_path, "v1.10.2", release("v1.10.2", hazard=100))
    old_b, old_c = legacy(base), legacy(cand)
    assert answer.headline(old_b)["text"] == answer.headline(base)["text"]
    assert answer.headline(old_c)["text"] == answer.headline(cand)["text"]
    for b, c in ((old_b, old_c), (old_b, cand), (base, old_c)):        # old with old, old with new
        changes = classify(b, c)
        assert sorted(ch.cls for ch in changes if ch.cls != "same") == ["new"], [(ch.id, ch.cls) for ch in changes]
        assert exit_code(changes) == 1


def test_a_reworded_assertion_still_pairs_by_its_id(tmp_path):
    base = ledger_of(tmp_path, "v1.8.2", release("v1.8.2"))
    cand = [dict(r, assertion=r["assertion"].upper()) for r in ledger_of(tmp_path, "v1.8.5", release("v1.8.5"))]
    assert {ch.cls for ch in classify(base, cand)} == {"same"}


# --- every output starts with the answer ------------------------------------------------------------------------
def test_run_report_and_matrix_open_with_the_headline_and_fold_load_rows(tmp_path):
    run = _one_run_folder(tmp_path)
    html, md = write_run_report(run)
    text = md.read_text()
    first = text.split("\n## ")[0]          # the first screen: before any section
    assert "**prescription holds on v1.8.2: yes (BEFORE 100 on 1 of 2 pods → AFTER 5; exit Healthy)**" in first
    assert "[BEFORE 100 on 1 of 2 pods](v1.8.2/before.timeline.jsonl)" in first          # linked to its evidence
    assert text.index("prescription holds on v1.8.2") < text.index("**run id:**")
    assert "brief §" not in text and "brief §" not in html.read_text()
    sec = text[text.index("## v1.8.2 · lane a"):text.index("## v1.8.2 · lane abort")]
    table = sec[:sec.index("<details>")]
    assert "load." not in table and "hazard seen ⚠" in table and "holds ✓" in table     # what each row means
    assert "| before | exposure | **fail** 0.31 | **pass** 40 | 400 | hazard seen ⚠ |" in sec
    page = html.read_text()
    assert page.index('class="headline') < page.index('class="meta"') and "<details><summary>load per phase" in page

    _, mmd = write_matrix([run], tmp_path / "reports")
    lines = mmd.read_text().splitlines()
    heads = [ln for ln in lines[:8] if ln.startswith("**prescription holds on ")]
    assert [h.split(":")[0] for h in heads] == ["**prescription holds on v1.8.2", "**prescription holds on v1.10.2"]
    assert "except with replicaProgressThreshold {type: Pods} (100)" in heads[1]


def test_console_summary_starts_with_the_answer_and_wraps_whole_words(tmp_path):
    run = _one_run_folder(tmp_path)
    rows = read_rows(run / "ledger.json")
    rows.append(dict(rows[2], id="a/cut-steps/dict-valued", assertion="a value that is a mapping " * 4,
                     observed={"phase": "Healthy", "stableRS": "abc"}))
    out = console.run_summary(rows, run)
    lines = out.splitlines()
    assert lines[0] == "prescription holds on v1.8.2: yes (BEFORE 100 on 1 of 2 pods → AFTER 5; exit Healthy)"
    assert lines[1] == f"    BEFORE 100 on 1 of 2 pods: {run / 'v1.8.2/before.timeline.jsonl'}"
    table = console.summary_table(rows, width=100)
    words = set(re.findall(r"[A-Za-z]{4,}", " ".join(r["assertion"] for r in rows)))
    cut = [w for w in words if w not in re.findall(r"[A-Za-z]{4,}", table)]
    assert cut == [], cut                                      # every word whole: nothing cut mid-word
    assert "{'" not in table and "phase: Healthy" in table
    assert "load exposure" in table and table.count("load.exposure") == 0


def test_drills_report_json_gives_the_headlines_and_the_failing_or_hazard_rows(tmp_path):
    reports = tmp_path / "reports"
    run = _one_run_folder(reports)
    r = drills("report", str(run), "--json", env={"DRILLS_REPORTS": str(reports)})
    assert r.returncode == 1, r.stderr                # the run it reports has a fail: its gate (tests/test_gates.py)
    doc = json.loads(r.stdout)
    assert list(doc) == ["headlines", "failing_or_hazard", "matrix", "incomplete", "exit"] and doc["exit"] == 1
    assert [h["holds"] for h in doc["headlines"]] == ["yes", "yes"]
    ids = {(x["controller"], x["id"]) for x in doc["failing_or_hazard"]}
    assert ("v1.10.2", "order/hazard-replica-progress-threshold/peak-weight") in ids
    assert ("v1.8.2", "a/before/peak-weight") in ids        # the incident reproduced: a hazard seen
    assert ("v1.10.2", "a/before/peak-weight") in ids       # 50 where 100 was expected: a fail
    assert all(x["verdict"] == FAIL or x["shows"] is True for x in doc["failing_or_hazard"])
    text = drills("report", str(run), env={"DRILLS_REPORTS": str(reports)})
    assert text.returncode == 1 and text.stdout.startswith("prescription holds on v1.8.2: yes"), text.stdout
    assert "failing or showing a hazard" in text.stdout and "hazard seen with replicaProgressThreshold" in text.stdout


# --- user-built controllers: observations only, named by what they are ----------------------------------------------
def test_a_user_built_controllers_load_rows_are_observations_and_it_answers_by_its_name(tmp_path):
    sha = "ab" * 32
    run = tmp_path / "ub"
    led = Ledger(run, "ub", "embedded", "v1.2.0+unknown", controller_sha256=sha, controller_name="v1.2.0+abababababab")
    record_lane_a(led, before=50, user_built=True)
    stats = {"exposure": {"requests": 400, "failures": 0, "failure_ratio": 0.0, "p95_ms": 12.0, "codes": {"200": 400},
                          "window": [0, 10]}}
    rows = load.record_phase_rows(led, "a", "before", stats, load.load_thresholds(), evidence="l.jsonl",
                                  judged="a user-built controller: its rows are observations")
    (ratio,) = [r for r in rows if r["id"] == "a/before/load.exposure.failure_ratio"]
    # the fix worked (no failure): an observation, never failed against the release threshold (>= 0.02)
    assert ratio["verdict"] == UNVERIFIED and ratio["shows"] is False and ratio["details"]["threshold"] == ">= 0.02"
    h = answer.headline(read_rows(run / "ledger.json"))
    assert h["text"] == "prescription holds on v1.2.0+abababababab: yes (BEFORE 50 → AFTER 5; exit Healthy)", h


def _fake_controller(folder: Path, says: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    f = folder / "rollouts-controller"
    f.write_text(f'#!/bin/sh\necho "rollouts-controller: {says}"\n')
    f.chmod(0o755)
    return f


def _commit_tree(tree: Path) -> str:
    """``tree`` made a git checkout of one commit; its HEAD, as ``git rev-parse --short=12`` gives it."""
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True, timeout=30)
    subprocess.run(git + ["add", "."], check=True, timeout=30)
    subprocess.run(git + ["commit", "-qm", "x"], check=True, timeout=30)
    return subprocess.run(git[:3] + ["rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                          timeout=30).stdout.strip()


def test_a_user_built_controller_is_named_by_its_version_and_commit_never_a_release(tmp_path):
    binary = _fake_controller(tmp_path / "bin", "v1.2.0+unknown")
    crds = tmp_path / "crds"
    crds.mkdir()
    (crds / "rollout-crd.yaml").write_text("kind: CustomResourceDefinition\n")
    info = inspect_binary(binary, crds=crds)
    assert info.name == f"v1.2.0+{info.sha256[:12]}" and "v1.7.2" not in info.name       # not a checkout: sha256
    tree = tmp_path / "src"
    (tree / "rollout").mkdir(parents=True)
    (tree / "rollout" / "trafficrouting.go").write_text("package rollout\n")
    head = _commit_tree(tree)
    assert inspect_binary(binary, crds=crds, source=tree).name == f"v1.2.0+{head}"
    # the leg ids and the cluster name of an upgrade-check follow that name
    from drills.run import legs, runner
    (leg,) = legs.plan(["v1.7.2"], ["a"], label=f"v1.2.0+{head}")
    assert leg.id == f"v1.2.0+{head}/a/stage" and "v1-7-2" not in runner.cluster_name(leg.label, 2)


def test_a_user_built_controller_that_reports_its_commit_is_named_by_it_when_no_checkout_says_otherwise(tmp_path):
    """Upstream's Makefile stamps the checkout's HEAD into the binary (``v1.2.0+351efb7``): a build from an
    exported tree (no git) is named by that commit, not by its sha256, which reads like one and is not."""
    crds = tmp_path / "crds"
    crds.mkdir()
    (crds / "rollout-crd.yaml").write_text("kind: CustomResourceDefinition\n")
    clean = _fake_controller(tmp_path / "clean", "v1.2.0+351efb7")
    dirty = _fake_controller(tmp_path / "dirty", "v1.2.0+351efb7.dirty")
    exported = tmp_path / "exported"                     # a source tree out of `git archive`: no .git
    (exported / "manifests" / "crds").mkdir(parents=True)
    (exported / "manifests" / "crds" / "rollout-crd.yaml").write_text("kind: CustomResourceDefinition\n")
    info = inspect_binary(clean, source=exported)
    assert (info.name, info.commit, info.version) == ("v1.2.0+351efb7", "351efb7", "v1.2.0")
    assert info.sha256[:12] not in info.name and "v1.7" not in info.name
    assert inspect_binary(clean, crds=crds).name == "v1.2.0+351efb7"
    assert inspect_binary(dirty, crds=crds).name == "v1.2.0+351efb7-dirty"
    # a checkout at another commit than the one the binary reports does not rename it: the binary is what ran
    head = _commit_tree(exported)
    assert inspect_binary(clean, source=exported).name == "v1.2.0+351efb7"
    agrees = _fake_controller(tmp_path / "agrees", f"v1.2.0+{head[:7]}")
    assert inspect_binary(agrees, source=exported).name == f"v1.2.0+{head}"      # the checkout's longer form
    for says in ("v1.2.0+unknown", "v1.2.0", "v1.2.0+notacommit"):              # nothing to go by: the sha256
        other = inspect_binary(_fake_controller(tmp_path / says.replace("+", "_"), says), crds=crds)
        assert other.name == f"v1.2.0+{other.sha256[:12]}", says


@pytest.mark.single_version
def test_a_live_drill_records_the_api_servers_kubernetes_version(kube, tmp_path):
    from drills.kube.api import new_client
    from drills.run.live import server_version
    from drills.core.procs import free_port
    assert server_version(kube) == config.KUBERNETES_VERSION        # the embedded cluster's, as a live one says it
    kc = tmp_path / "kubeconfig"
    kc.write_text(f"apiVersion: v1\nkind: Config\ncurrent-context: gone\nclusters: [{{name: c, cluster: {{server: "
                  f"'http://127.0.0.1:{free_port()}'}}}}]\nusers: [{{name: u, user: {{token: x}}}}]\n"
                  f"contexts: [{{name: gone, context: {{cluster: c, user: u}}}}]\n")
    assert server_version(new_client(kc, "gone")) is None           # not known: said as such, the drill goes on
