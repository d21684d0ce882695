"""Input and output paths: every output path is checked before the first byte is written (writable, not an input,
not inside another run folder), so a bad one is exit 2 with one line, nothing printed as if the work had been done,
and no input overwritten; an empty --fail-on is refused, not taken for "gate off"; watch --out creates nothing
before the kubeconfig and the target are checked; the live --service-url is never the API server itself or a
link-local/metadata address (no cluster needed)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from apistub import StubAPI, kubeconfig_for

ROOT = Path(__file__).resolve().parent.parent
ROLLOUT = """apiVersion: argoproj.io/v1alpha1
kind: Rollout
metadata: {name: checkout, namespace: shop}
spec:
  replicas: 4
  rollbackWindow: {revisions: 3}
  strategy:
    canary:
      trafficRouting: {istio: {virtualService: {name: vs}, destinationRule: {name: dr}}}
      steps: [{setWeight: 5}, {pause: {}}, {setWeight: 100}]
"""


def drills(*args, tmp: Path, env: dict | None = None, stdin: str | None = None, timeout: float = 120):
    e = dict(os.environ, DRILLS_REPORTS=str(tmp / "reports"), DRILLS_CONFIG=str(tmp / "none.yaml"),
             PYTHONPATH=str(ROOT))
    e.pop("KUBECONFIG", None)
    e.update(env or {})
    if args and args[0] == "scan" and "--fail-on" not in args:
        args = (*args, "--fail-on", "none", "--allow-empty")   # what is tested here is not the scan's gate
    return subprocess.run([sys.executable, "-m", "drills", *map(str, args)], capture_output=True, text=True,
                          input=stdin, timeout=timeout, env=e, cwd=tmp)


def refused(r, *needles) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout[-1000:], r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("drills: ") and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == "", r.stdout[-1000:]          # nothing printed as if the scan had been done
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def _state(p: Path) -> tuple:
    st = p.stat()
    return p.read_bytes(), st.st_mtime_ns, st.st_ino


@pytest.fixture
def manifests(tmp_path) -> Path:
    d = tmp_path / "manifests"
    d.mkdir()
    (d / "checkout.yaml").write_text(ROLLOUT)
    return d


@pytest.mark.parametrize("flag", ["--sarif", "--junit"])
def test_an_output_that_is_an_input_is_refused_and_the_input_left_as_it_was(tmp_path, manifests, flag):
    src = manifests / "checkout.yaml"
    before = _state(src)
    refused(drills("scan", src, flag, src, tmp=tmp_path), flag, "is an input")
    (tmp_path / "link.yaml").symlink_to(src)
    os.link(src, tmp_path / "hard.yaml")
    refused(drills("scan", src, flag, tmp_path / "link.yaml", tmp=tmp_path), "is an input")
    refused(drills("scan", src, flag, tmp_path / "hard.yaml", tmp=tmp_path), "is an input")
    # a file the input folder would be read for, and a file of a fleet layout
    refused(drills("scan", manifests, flag, manifests / "new.yaml", tmp=tmp_path), "input folder")
    refused(drills("scan", "--fleet", ROOT / "fixtures" / "fleet", flag, ROOT / "fixtures" / "fleet" / "x.xml",
                   tmp=tmp_path), "an input of this command")
    assert _state(src) == before and not (manifests / "new.yaml").exists()
    assert not (ROOT / "fixtures" / "fleet" / "x.xml").exists()


def test_outputs_that_cannot_be_written_are_refused_before_the_table_is_printed(tmp_path, manifests):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for flag in ("--sarif", "--junit"):
        refused(drills("scan", manifests, flag, blocker / "out.xml", tmp=tmp_path), flag, "cannot write there")
        refused(drills("scan", manifests, flag, tmp_path, tmp=tmp_path), flag, "is a folder")
        refused(drills("scan", manifests, flag, "/proc/drills-out.xml", tmp=tmp_path), flag, "cannot write there")
    refused(drills("scan", manifests, "--sarif", tmp_path / "same", "--junit", tmp_path / "same", tmp=tmp_path),
            "same file")
    assert not (tmp_path / "same").exists()
    # a run folder is another run's record
    run = tmp_path / "reports" / "20261201T000000Z-1"
    run.mkdir(parents=True)
    (run / "ledger.json").write_text("[]")
    refused(drills("scan", manifests, "--sarif", run / "scan.sarif", tmp=tmp_path), "inside the run folder")
    assert sorted(p.name for p in run.iterdir()) == ["ledger.json"]
    # the good case still writes, into folders made for it
    r = drills("scan", manifests, "--sarif", tmp_path / "out" / "s.sarif", "--junit", tmp_path / "out" / "j.xml",
               tmp=tmp_path)
    assert r.returncode == 0 and (tmp_path / "out" / "s.sarif").stat().st_size > 0, r.stderr
    assert (tmp_path / "out" / "j.xml").stat().st_size > 0


@pytest.mark.parametrize("value", ["", " ", ","])
def test_an_empty_fail_on_is_refused_not_taken_for_gate_off(tmp_path, manifests, value):
    refused(drills("scan", manifests, "--fail-on", value, tmp=tmp_path), "--fail-on", "empty")


def test_unwritable_reports_folder_is_exit_2_before_anything_runs(tmp_path, manifests):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    env = {"DRILLS_REPORTS": str(blocker / "reports")}
    for args in (["probe", "--steps", "5,100"], ["run", "--lanes", "a"], ["report"],
                 ["upgrade-check", "--from", "v1.8.2", "--to", "v1.10.2", "--runs", tmp_path],
                 ["scan", manifests, "--verify", "1"]):
        r = drills(*args, tmp=tmp_path, env=dict(env, DRILLS_CACHE=str(tmp_path / "cache")))
        refused(r, "DRILLS_REPORTS", "cannot write there")
    assert not (tmp_path / "cache" / "clusters").exists()


def test_watch_out_is_created_only_after_the_kubeconfig_and_the_target_are_checked(tmp_path):
    out = tmp_path / "new" / "folder" / "timeline.jsonl"
    r = drills("watch", "-n", "ns", "r", "--kubeconfig", tmp_path / "missing", "--duration", "5s", "--out", out,
               tmp=tmp_path)
    assert r.returncode == 2 and "does not exist" in r.stderr, r.stderr
    kc = kubeconfig_for(tmp_path / "kc", "http://127.0.0.1:9")       # nothing listens there
    r = drills("watch", "-n", "ns", "r", "--kubeconfig", kc, "--duration", "5s", "--out", out, tmp=tmp_path)
    assert r.returncode == 2 and "cannot reach the API server" in r.stderr, r.stderr
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept.jsonl"
    kept.write_text("an earlier recording\n")
    r = drills("watch", "-n", "ns", "r", "--kubeconfig", kc, "--duration", "5s", "--out", kept, tmp=tmp_path)
    assert r.returncode == 2 and kept.read_text() == "an earlier recording\n"
    r = drills("watch", "-n", "ns", "r", "--kubeconfig", kc, "--duration", "5s", "--out", kc, tmp=tmp_path)
    assert r.returncode == 2 and "is an input" in r.stderr, r.stderr


@pytest.mark.parametrize("url", ["{api}/", "{api}/healthz", "http://localhost:{port}/", "http://127.0.0.2:{port}/",
                                 "http://[::1]:{port}/", "http://127.1:{port}/", "http://169.254.169.254/",
                                 "http://[fd00:ec2::254]/latest", "http://2852039166/", "http://[::ffff:169.254.169.254]/",
                                 "http://metadata.google.internal/computeMetadata/v1/", "http://[fe80::1]/",
                                 "https://kubernetes.default.svc/"])
def test_live_service_url_is_never_the_api_server_or_a_metadata_address(tmp_path, url):
    api = StubAPI()
    try:
        kc = kubeconfig_for(tmp_path / "kc", api.url)
        (tmp_path / "none.yaml").write_text("allowed_contexts: [stage]\n")
        given = url.format(api=api.url, port=api.url.rsplit(":", 1)[1])
        r = drills("run", "--kubeconfig", kc, "--context", "stage", "--namespace", "ns", "--rollout", "r",
                   "--service-url", given, tmp=tmp_path)
        line = refused(r, "--service-url")
        assert "API server" in line or "metadata" in line or "link-local" in line, line
        assert api.requests == []
    finally:
        api.close()
