"""The real helm binary and the chart registry lane B publishes to.

`Helm` runs the helm binary built by the toolchain (subprocess, isolated HELM_* homes so a user's repositories
and registry logins are neither read nor written).  `Registry` serves distribution's `registry` on 127.0.0.1
with filesystem storage in a temporary folder.  `publish` packages a chart source folder and pushes it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from ..core import config
from ..core.errors import BadInput
from ..core.procs import die_with_parent, run_bounded
from ..core.wait import WaitTimeout, until
from ..core import fastyaml


class HelmError(RuntimeError):
    """helm exited non-zero (the message carries its command and stderr)."""


class ChartInputError(BadInput, ValueError):
    """Bad input: a values file that is not YAML, a missing valueFile, an unknown chart version, ...
    The message names the file and, where there is one, the line (``path:line: what``)."""


class RegistryError(RuntimeError):
    """The chart registry did not start or answer."""


# --- binaries -------------------------------------------------------------------------------------
def _toolchain_binary(component: str, version: str, binary: str, build: bool) -> Path:
    from ..toolchain import Toolchain
    from ..toolchain.components import base_components, optional_components

    tc = Toolchain()
    path = tc.bin(component, version, binary)
    if path.exists():
        return path
    if build:
        comps = {c.name: c for c in base_components()} | optional_components()
        tc.ensure([comps[component]])
    if not path.exists():
        raise HelmError(f"{binary} {version} is not built ({path}); run: drills toolchain build"
                        + (" --extra registry" if component == "registry" else ""))
    return path


def helm_binary(build: bool = True) -> Path:
    """The toolchain's helm; built from its Go module when missing (build=True)."""
    return _toolchain_binary("helm", config.HELM_VERSION, "helm", build)


def registry_binary(build: bool = True) -> Path:
    """The toolchain's distribution `registry`; built from its Go module when missing (build=True)."""
    return _toolchain_binary("registry", config.REGISTRY_VERSION, "registry", build)


# --- helm -----------------------------------------------------------------------------------------
class Helm:
    """Runs helm with its own cache/config/data homes (a temporary folder unless `home` is given)."""

    def __init__(self, binary: Path | str | None = None, home: Path | str | None = None, timeout: float = 300):
        self.binary = Path(binary) if binary else helm_binary()
        self.timeout = timeout
        self._tmp = None
        if home is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="drills-helm-")
            home = self._tmp.name
        home = Path(home)
        self.env = dict(os.environ)
        self.env.update({
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
            "HELM_REGISTRY_CONFIG": str(home / "config" / "registry" / "config.json"),
            "HELM_REPOSITORY_CONFIG": str(home / "config" / "repositories.yaml"),
            "HELM_REPOSITORY_CACHE": str(home / "cache" / "repository"),
        })

    def run(self, *args: str, cwd: Path | str | None = None) -> str:
        cmd = [str(self.binary), *map(str, args)]
        try:        # in a process group of its own, dying with the command and killed on a timeout or a signal
            proc = run_bounded(cmd, timeout=self.timeout, env=self.env, cwd=cwd)
        except subprocess.TimeoutExpired as e:
            raise HelmError(f"helm {' '.join(map(str, args))}: timed out after {self.timeout:.0f}s") from e
        if proc.returncode != 0:
            raise HelmError(f"helm {' '.join(map(str, args))}: exit {proc.returncode}: "
                            f"{(proc.stderr or proc.stdout).strip()}")
        return proc.stdout

    def version(self) -> str:
        return self.run("version", "--template", "{{.Version}}").strip()

    def template(self, chart_dir: Path | str, release: str, namespace: str,
                 value_files: list[Path | str] = ()) -> str:
        args = ["template", release, str(chart_dir), "--namespace", namespace]
        for f in value_files:
            args += ["--values", str(f)]
        return self.run(*args)

    def dependency_update(self, chart_dir: Path | str, plain_http: bool = False) -> str:
        args = ["dependency", "update", str(chart_dir), "--skip-refresh"]
        if plain_http:
            args.append("--plain-http")
        return self.run(*args)

    def package(self, chart_dir: Path | str, dest: Path | str) -> Path:
        Path(dest).mkdir(parents=True, exist_ok=True)
        out = self.run("package", str(chart_dir), "--destination", str(dest))
        m = re.search(r"saved it to:\s*(\S+)", out)
        if not m:
            raise HelmError(f"helm package {chart_dir}: no package path in output: {out.strip()}")
        return Path(m.group(1))

    def push(self, package: Path | str, remote: str, plain_http: bool = True) -> str:
        args = ["push", str(package), remote]
        if plain_http:
            args.append("--plain-http")
        # helm push reports on stderr; run() returns stdout, so keep both here.
        cmd = [str(self.binary), *args]
        proc = run_bounded(cmd, timeout=self.timeout, env=self.env)
        if proc.returncode != 0:
            raise HelmError(f"helm {' '.join(args)}: exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()}")
        return (proc.stdout + proc.stderr).strip()

    def pull(self, ref: str, version: str, dest: Path | str, plain_http: bool = True) -> Path:
        Path(dest).mkdir(parents=True, exist_ok=True)
        args = ["pull", ref, "--version", version, "--destination", str(dest)]
        if plain_http:
            args.append("--plain-http")
        self.run(*args)
        name = ref.rstrip("/").rsplit("/", 1)[-1]
        path = Path(dest) / f"{name}-{version}.tgz"
        if not path.exists():
            raise HelmError(f"helm pull {ref} {version}: {path} not written")
        return path

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# --- the chart registry ---------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    """`registry serve CONFIG` on 127.0.0.1:<free port>, filesystem storage in a temporary folder.

    Use as a context manager (or start()/stop()); stop() always runs and removes the storage.
    """

    def __init__(self, binary: Path | str | None = None, workdir: Path | str | None = None):
        self.binary = Path(binary) if binary else registry_binary()
        self._tmp = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="drills-registry-")
            workdir = self._tmp.name
        self.workdir = Path(workdir)
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.log_path = self.workdir / "registry.log"

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The OCI repository base charts are pushed to and depended on from."""
        return f"oci://{self.host}/charts"

    def _write_config(self) -> Path:
        cfg = {
            "version": 0.1,
            "log": {"level": "info", "formatter": "text"},
            "storage": {"filesystem": {"rootdirectory": str(self.workdir / "storage")},
                        "delete": {"enabled": True}},
            "http": {"addr": self.host},
        }
        path = self.workdir / "config.yml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return path

    def start(self, timeout: float = 30.0) -> "Registry":
        self.workdir.mkdir(parents=True, exist_ok=True)
        last = ""
        for _attempt in range(3):
            self.port = free_port()
            cfg = self._write_config()
            logf = open(self.log_path, "a")
            self.proc = subprocess.Popen([str(self.binary), "serve", str(cfg)], stdout=logf,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=die_with_parent)
            logf.close()
            try:
                until(f"the registry to answer on {self.host}/v2/", lambda: self.proc.poll() is not None or
                      self._answers(), timeout=timeout, interval=0.1)
            except WaitTimeout:
                pass
            if self.proc.poll() is None and self._answers():
                return self
            last = self.log_path.read_text()[-2000:]
            self._terminate()
            if "address already in use" not in last:
                break
        raise RegistryError(f"registry did not answer on {self.host}/v2/: {last.strip()}")

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=1) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def tags(self, repository: str = "charts/base") -> list[str]:
        """Tags the registry holds for `repository` (OCI tags spell chart versions, `+` as `_`)."""
        try:
            with urllib.request.urlopen(f"http://{self.host}/v2/{repository}/tags/list", timeout=5) as r:
                data = json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return []
            raise
        return sorted(data.get("tags") or [])

    def _terminate(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        self._terminate()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def publish(helm: Helm, chart_dir: Path | str, registry: Registry, workdir: Path | str) -> dict:
    """`helm package` a chart source folder and `helm push` it to the registry; returns what was pushed."""
    meta = fastyaml.safe_load((Path(chart_dir) / "Chart.yaml").read_text())
    pkg = helm.package(chart_dir, workdir)
    out = helm.push(pkg, registry.url, plain_http=True)
    digest = re.search(r"Digest:\s*(\S+)", out)
    return {"name": meta["name"], "version": str(meta["version"]), "package": str(pkg),
            "ref": f"{registry.url}/{meta['name']}:{meta['version']}",
            "digest": digest.group(1) if digest else None}


def copy_tree(src: Path | str, dest: Path | str) -> Path:
    """Copy a fixture tree to a working folder (fixtures are never modified in place)."""
    dest = Path(dest)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("*.tgz", "Chart.lock", "__pycache__"))
    return dest
