"""Journals are not trusted as found: written 0600 with a digest of their content that restore checks, rollout
keys of plain names, read within a size and depth budget; every refusal names the way out
(`drills restore --release-lease`), which the README documents.  The API servers here record every request, so
"nothing was sent" is checked, not assumed."""
from __future__ import annotations

import json
import stat

import pytest

from drills.core import config
from drills.core.journal_file import digest_of
from drills.drill.safety import Journal, JournalError, lease_value, parse_lease


def _ro(image="a:v2", name="svc"):
    return {"metadata": {"namespace": "ns", "name": name}, "spec": {
        "template": {"spec": {"containers": [{"name": "app", "image": image}]}},
        "strategy": {"canary": {"steps": [{"setWeight": 5}, {"setWeight": 100}]}}}, "status": {"phase": "Healthy"}}


@pytest.fixture
def journal(tmp_path, status_server_factory, kubeconfig_to):
    """A journal a drill wrote, and the recording API server it names."""
    srv = status_server_factory(200, "OK")
    kc = kubeconfig_to(tmp_path / "kc", srv.url, context="stage")
    j = Journal(tmp_path / "run" / "journal.json", kubeconfig=str(kc), context="stage", run_id="r1")
    j.before_spec_change(_ro(), intended=_ro("a:v3"))
    j.server = srv
    return j


def _restore(drills_cmd, path, *more):
    return drills_cmd("restore", "--journal", path, "--allow-context", "stage", *more, timeout=120)


def test_a_journal_is_written_for_its_owner_only_and_carries_its_digest(journal):
    mode = stat.S_IMODE(journal.path.stat().st_mode)
    assert mode == 0o600, oct(mode)
    data = json.loads(journal.path.read_text())
    assert data["digest"] == digest_of(data) and data["digest"].startswith("sha256:")
    journal.set_state("abandoned")
    data = json.loads(journal.path.read_text())
    assert stat.S_IMODE(journal.path.stat().st_mode) == 0o600 and data["digest"] == digest_of(data)
    assert [p.name for p in journal.path.parent.iterdir()] == ["journal.json"]
    assert Journal.load(journal.path).state == "abandoned"


@pytest.mark.parametrize("edit", ["image", "privileged", "steps", "digest removed", "run", "kubeconfig"])
def test_an_edited_journal_is_refused_and_nothing_is_sent(journal, drills_cmd, edit):
    data = json.loads(journal.path.read_text())
    orig = data["rollouts"]["ns/svc"]["original"]
    if edit == "image":
        orig["template"]["spec"]["containers"][0]["image"] = "evil.example/miner:latest"
    elif edit == "privileged":
        orig["template"]["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    elif edit == "steps":
        orig["steps"] = [{"setWeight": 100}]
    elif edit == "digest removed":
        del data["digest"]
    elif edit == "run":
        data["run_id"] = "r2"
    else:
        data["kubeconfig"] = "/etc/kubernetes/admin.conf"
    journal.path.write_text(json.dumps(data))
    r = _restore(drills_cmd, journal.path)
    assert r.returncode == 2, r.stderr
    line = [x for x in r.stderr.strip().splitlines() if x.startswith("drills:")][-1]
    assert str(journal.path) in line and "digest" in line and "nothing was sent" in line, line
    assert "drills restore --release-lease --journal" in line, line
    assert journal.server.requests == []


def test_a_forged_digest_does_not_let_a_key_that_is_no_name_through(journal, drills_cmd):
    """Even recomputed (anyone can), the digest does not make ns/svc/../../x a Rollout: refused before a request."""
    data = json.loads(journal.path.read_text())
    data["rollouts"]["ns/svc/../../x"] = data["rollouts"].pop("ns/svc")
    data["digest"] = digest_of(data)
    journal.path.write_text(json.dumps(data))
    r = _restore(drills_cmd, journal.path)
    assert r.returncode == 2 and "namespace/name" in r.stderr and "ns/svc/../../x" in r.stderr, r.stderr
    assert journal.server.requests == []
    assert json.loads(journal.path.read_text())["state"] == "open"          # not marked restored


@pytest.mark.parametrize("key", ["ns/svc/../../x", "../ns/svc", "ns/..", "ns/", "/svc", "ns/svc x", "NS\n/svc"])
def test_rollout_keys_are_namespace_slash_name_of_plain_names(tmp_path, key):
    j = Journal(tmp_path / "j.json", run_id="r")
    j.before_spec_change(_ro())
    data = json.loads(j.path.read_text())
    data["rollouts"] = {key: data["rollouts"]["ns/svc"]}
    data["digest"] = digest_of(data)
    j.path.write_text(json.dumps(data))
    with pytest.raises(JournalError, match="is not namespace/name"):
        Journal.load(j.path)


@pytest.mark.parametrize("doc", ["[" * 100_000 + "]" * 100_000, '{"rollouts": ' + '{"a": ' * 100_000 + "1" +
                                 "}" * 100_001, '{"rollouts": {}, "x": ' + "[" * 150 + "]" * 150 + "}"])
def test_a_journal_nested_too_deep_is_exit_2_one_line(tmp_path, drills_cmd, doc):
    path = tmp_path / "journal.json"
    path.write_text(doc)
    r = drills_cmd("restore", "--journal", path, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "nested deeper" in lines[0], r.stderr


def test_the_lease_carries_the_digest_of_the_original_and_a_journal_that_differs_from_it_is_told(journal):
    key = "ns/svc"
    value = parse_lease(lease_value("r1", journal.path, journal.original_digest(key)))
    assert value["original"] == journal.original_digest(key) and value["run"] == "r1"
    # the lease value carries nothing the journal could change afterwards: an edited original differs from it
    data = json.loads(journal.path.read_text())
    data["rollouts"][key]["original"]["template"]["spec"]["containers"][0]["image"] = "other:1"
    data["digest"] = digest_of(data)
    journal.path.write_text(json.dumps(data))
    assert Journal.load(journal.path).original_digest(key) != value["original"]


def test_the_way_out_the_refusals_point_to_is_documented_in_the_readme():
    readme = (config.project_root() / "README.md").read_text()
    assert "A way out" in readme and "drills restore --release-lease --journal" in readme
    section = readme[readme.index("A way out"):][:2500]
    for needle in ("allowlist", "opt-in label", "drills.dev/lease-released", "digest"):
        assert needle in section, needle


def test_release_lease_checks_the_allowlist_before_any_request(journal, drills_cmd):
    r = drills_cmd("restore", "--release-lease", "--journal", journal.path, timeout=60)
    assert r.returncode == 2 and "not allowlisted" in r.stderr, r.stderr
    assert journal.server.requests == []
