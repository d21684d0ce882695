"""The real kube-state-metrics (built by the toolchain from k8s.io/kube-state-metrics/v2) on 127.0.0.1, exporting
the custom-resource-state metrics the alert rules read (the weight, the step, the phase and the pod hashes of
each Rollout; drills.alerts.metrics.KSM_CONFIG) from the cluster the drill runs on.

Only those metrics (``--custom-resource-state-only``), on loopback ports of its own; its log and config in a
folder under the cluster folder; registered with the cluster (so ``drills cluster down`` stops it too) and
always stopped by ``stop()`` or the context manager.  It dies with the process that started it."""
from __future__ import annotations

import re
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import yaml

from ..core import config
from ..core.procs import ProcessExited, die_with_parent, free_port, stop_process, wait_http
from ..core.wait import WaitTimeout, until

NAME = "kube-state-metrics"
READY_TIMEOUT_S = 60.0
SCRAPE_BUDGET = 4 << 20           # bytes of one /metrics read: the drill's few Rollouts take a few KiB
# its own counter of the watches it started: with client-go's watch-list it counts when the stream opens, the
# initial objects arriving just after (the drill's Rollouts are created later, and Prometheus' first scrape waits)
_WATCH_OK = re.compile(r'^kube_state_metrics_watch_total\{[^}]*result="success"[^}]*\}\s+([0-9.e+]+)\s*$', re.M)


class KubeStateMetricsError(RuntimeError):
    pass


def component():
    from ..toolchain.components import optional_components
    return optional_components()[NAME]


def binary() -> Path:
    """The toolchain's kube-state-metrics binary, built first (or waited for) when missing."""
    from ..toolchain import Toolchain
    return Toolchain().get(component()) / NAME


def _read(url: str, budget: int = SCRAPE_BUDGET) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        body = r.read(budget + 1)
    if len(body) > budget:
        raise KubeStateMetricsError(f"{url}: more than {budget} bytes")
    return body.decode("utf-8", "replace")


class KubeStateMetrics:
    def __init__(self, kubeconfig: Path | str, folder: Path | str, resource_config: dict, register=None,
                 unregister=None, exe: Path | None = None, ready_timeout: float = READY_TIMEOUT_S, log=None):
        self.exe = Path(exe or binary())
        if not self.exe.is_file():
            raise KubeStateMetricsError(f"no kube-state-metrics binary at {self.exe}: run "
                                        f"`python -m drills toolchain build --extra {NAME}`")
        self.say = log or (lambda m: None)
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{NAME}-", dir=folder))
        self.config_path = self.workdir / "custom-resource-state.yaml"
        self.config_path.write_text(yaml.safe_dump(resource_config, sort_keys=False))
        self.log = self.workdir / f"{NAME}.log"
        self.port, self.telemetry_port = free_port(), free_port()
        self.hostport = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.hostport}"
        self.version = config.KUBE_STATE_METRICS_VERSION
        self._unregister = unregister
        self._logf = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [str(self.exe), f"--kubeconfig={Path(kubeconfig).resolve()}", "--custom-resource-state-only",
             f"--custom-resource-state-config-file={self.config_path}", "--host=127.0.0.1", f"--port={self.port}",
             "--telemetry-host=127.0.0.1", f"--telemetry-port={self.telemetry_port}"],
            stdout=self._logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=die_with_parent)
        try:
            if register is not None:
                register(NAME, self.proc.pid, [self.port, self.telemetry_port], self.log)
            self._wait_ready(ready_timeout)
        except BaseException:
            self.stop()
            raise

    def _watching(self) -> bool:
        if self.proc.poll() is not None:
            raise ProcessExited(f"{NAME} exited with {self.proc.returncode} before it watched the Rollouts\n"
                                f"{self.log.read_text(errors='replace')[-2000:]}")
        try:
            m = _WATCH_OK.search(_read(f"http://127.0.0.1:{self.telemetry_port}/metrics"))
        except OSError:
            return False
        return bool(m) and float(m.group(1)) >= 1

    def _wait_ready(self, timeout: float) -> None:
        self.say(f"{NAME} {self.version}: waiting for it to list and watch the Rollouts (log {self.log})")
        try:
            wait_http(self.url + "/metrics", timeout, self.proc, self.log)
            until(f"{NAME}'s first list of the Rollouts (its watch started)", self._watching, timeout=timeout,
                  interval=0.2)
        except WaitTimeout as e:
            raise KubeStateMetricsError(f"{e} (log {self.log})") from None

    def metrics(self) -> str:
        """One read of its /metrics (the samples Prometheus scrapes)."""
        return _read(self.url + "/metrics")

    def stop(self) -> None:
        stop_process(self.proc, timeout=15)
        if not self._logf.closed:
            self._logf.close()
        if self._unregister is not None:
            try:
                self._unregister(NAME)
            except Exception:
                pass
            self._unregister = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
