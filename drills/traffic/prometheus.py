"""A real Prometheus (built by the toolchain from github.com/prometheus/prometheus) on 127.0.0.1.

It scrapes the mesh emulator every second, keeps its TSDB in a temporary folder under the cluster folder,
and is always stopped by the context manager (or by ``drills cluster down`` through the pid it registers).
AnalysisTemplates reach it through Argo's prometheus provider at ``Prometheus.url``.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from ..core import config
from .mesh import require_loopback
from ..core.procs import die_with_parent, free_port, stop_process, wait_http
from ..core.wait import WaitTimeout, until


class PrometheusError(RuntimeError):
    pass


def binary_path() -> Path:
    from ..toolchain import Toolchain
    return Toolchain().bin("prometheus", config.PROMETHEUS_VERSION, "prometheus")


def ensure_binary() -> Path:
    """The toolchain's prometheus binary, built first when missing (6-9 min on 2 cores)."""
    from ..toolchain import Toolchain
    from ..toolchain.components import optional_components
    tc = Toolchain()
    comp = optional_components()["prometheus"]
    tc.ensure([comp])
    return tc.dir(comp) / "prometheus"


def scrape_config(targets: dict[str, str], interval_s: float = 1.0, rule_files: list | tuple = (),
                  honor_labels: bool = False) -> dict:
    """targets: job name -> 'host:port' (loopback only).  ``rule_files``: rules Prometheus evaluates (paths);
    ``honor_labels``: the targets' own labels win (the Rollout's ``namespace`` and ``name`` on the controller's
    metrics and on kube-state-metrics' custom-resource ones)."""
    jobs = []
    for job, hostport in targets.items():
        require_loopback(hostport.rsplit(":", 1)[0])
        jobs.append({"job_name": job, "scrape_interval": f"{interval_s:g}s", "scrape_timeout": f"{interval_s:g}s",
                     "metrics_path": "/metrics", "static_configs": [{"targets": [hostport]}],
                     **({"honor_labels": True} if honor_labels else {})})
    out = {"global": {"scrape_interval": f"{interval_s:g}s", "evaluation_interval": f"{interval_s:g}s"},
           "scrape_configs": jobs}
    if rule_files:
        out["rule_files"] = [str(p) for p in rule_files]
    return out


class Prometheus:
    def __init__(self, folder: Path, targets: dict[str, str], binary: Path | None = None, register=None, unregister=None,
                 interval_s: float = 1.0, ready_timeout: float = 60.0, rule_files: list | tuple = (),
                 honor_labels: bool = False):
        self.binary = Path(binary or binary_path())
        if not self.binary.is_file():
            raise PrometheusError(f"no prometheus binary at {self.binary}: run "
                                  f"`python -m drills toolchain build --extra prometheus`")
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.workdir = Path(tempfile.mkdtemp(prefix="prometheus-", dir=folder))
        self.config_path = self.workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(scrape_config(targets, interval_s, rule_files, honor_labels),
                                                   sort_keys=False))
        self.log = self.workdir / "prometheus.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._unregister = unregister
        self._logf = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [str(self.binary), f"--config.file={self.config_path}", f"--storage.tsdb.path={self.workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=2h",
             "--web.enable-lifecycle", "--log.level=warn"],
            stdout=self._logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=die_with_parent)
        # its record's name is its own (its pid): the legs of a run (lanes abort, escape, alert) and the probes of a
        # lane run theirs on one cluster at once, and a shared name let one's record replace another's
        self.name = f"prometheus-{self.proc.pid}"
        try:
            if register is not None:
                register(self.name, self.proc.pid, [self.port], self.log)
            wait_http(self.url + "/-/ready", ready_timeout, self.proc, self.log)
        except BaseException:
            self.stop()
            raise

    def query(self, promql: str, at: float | None = None) -> list[dict]:
        """Instant query; the ``result`` list of a vector (or [scalar] wrapped)."""
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        with urllib.request.urlopen(self.url + "/api/v1/query?" + urllib.parse.urlencode(params), timeout=10) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise PrometheusError(f"query failed: {body}")
        data = body["data"]
        return data["result"] if data["resultType"] in ("vector", "matrix") else [{"value": data["result"]}]

    def value(self, promql: str) -> float | None:
        """The first sample of an instant query as a float; None when the vector is empty."""
        res = self.query(promql)
        return float(res[0]["value"][1]) if res else None

    def alerts(self) -> list[dict]:
        """The alerts the rules have active now (``/api/v1/alerts``): labels, annotations, state, activeAt."""
        with urllib.request.urlopen(self.url + "/api/v1/alerts", timeout=10) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise PrometheusError(f"alerts failed: {body}")
        return body["data"]["alerts"]

    def rule_health(self) -> list[dict]:
        """Every loaded rule's name, health and last error (``/api/v1/rules``)."""
        with urllib.request.urlopen(self.url + "/api/v1/rules", timeout=10) as r:
            body = json.loads(r.read())
        return [{"name": rule.get("name"), "health": rule.get("health"), "lastError": rule.get("lastError")}
                for g in body["data"]["groups"] for rule in g["rules"]]

    def targets_up(self) -> dict[str, str]:
        with urllib.request.urlopen(self.url + "/api/v1/targets", timeout=10) as r:
            body = json.loads(r.read())
        return {t["scrapeUrl"]: t["health"] for t in body["data"]["activeTargets"]}

    def wait_scraped(self, timeout: float = 30.0) -> None:
        try:
            until("every scrape target up", self.targets_up, lambda t: bool(t) and all(h == "up" for h in t.values()),
                  timeout, interval=0.5)
        except WaitTimeout as e:
            raise PrometheusError(str(e)) from None

    def stop(self, keep_data: bool = False) -> None:
        stop_process(self.proc, timeout=15)
        if not self._logf.closed:
            self._logf.close()
        if self._unregister is not None:
            try:
                self._unregister(self.name)
            except Exception:
                pass
        if not keep_data:
            shutil.rmtree(self.workdir / "data", ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
