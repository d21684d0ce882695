"""The embedded cluster's record of itself: state.json in the cluster folder, and the processes it names.

Every process the product starts for a cluster is recorded when it starts: name, pid, its start time and the
boot's id (drills.core.procs.identity), whether the product made it the leader of a process group of its own, its
ports and log.  The control-plane processes kwokctl starts (a child of the product) are recorded the same way as
soon as kwokctl has started them.  `down` signals a recorded process only when it is provably that process still
(pid, start time and boot id as recorded, and a command line naming this cluster's folder or kubeconfig): after a
reboot, with a pid reused by someone else, or for a state file edited by hand, nothing is signalled.  kwokctl
stops what its own pid files name, so a pid file that names a process the record does not prove is removed
before kwokctl is asked to stop anything.
"""
from __future__ import annotations

import fcntl
import json
import os
import threading
from contextlib import contextmanager
from pathlib import Path

from ..core.procs import boot_id, cmdline, identity, is_pid, pid_alive, proven, start_time
from .errors import ClusterStateError

MAX_STATE_BYTES = 4 << 20


class ClusterState:
    """state.json and the process records of one cluster (its folder, kubeconfig and kwokctl folder are the
    subclass's)."""

    name: str
    folder: Path
    kubeconfig: Path
    state_file: Path
    kwok_workdir: Path

    @property
    def kwok_dir(self) -> Path:
        return self.kwok_workdir / "clusters" / self.name

    # --- reading ------------------------------------------------------------------------------------------
    def _load(self):
        """The state file's JSON (FileNotFoundError when there is none); ValueError when it cannot be read."""
        with open(self.state_file, "rb") as fh:
            raw = fh.read(MAX_STATE_BYTES + 1)
        if len(raw) > MAX_STATE_BYTES:
            raise ValueError(f"larger than {MAX_STATE_BYTES >> 20} MiB")
        try:
            return json.loads(raw)
        except RecursionError:
            raise ValueError("nested too deep") from None

    def state(self) -> dict:
        try:
            data = self._load()
        except (OSError, ValueError, UnicodeDecodeError):
            return {}
        return data if isinstance(data, dict) else {}

    def state_error(self) -> str | None:
        """Why the state file cannot be read (None when it is fine or absent)."""
        try:
            data = self._load()
        except FileNotFoundError:
            return None
        except (OSError, ValueError, UnicodeDecodeError) as e:
            return f"{self.state_file} is not valid JSON ({e})"
        return None if isinstance(data, dict) else f"{self.state_file} does not hold a JSON object"

    def check_state(self) -> None:
        """ClusterStateError when the state file is JSON but not as drills writes it (a pid that is no number)."""
        st = self.state()
        where = f"{self.state_file}:"
        fix = "; the state file is not as drills wrote it (`drills cluster down` stops what it can prove is this " \
              "cluster's and removes the rest)"
        procs = st.get("processes", [])
        if not isinstance(procs, list):
            raise ClusterStateError(f"{where} processes is not a list{fix}")
        for i, p in enumerate(procs):
            if not isinstance(p, dict) or not isinstance(p.get("name"), str):
                raise ClusterStateError(f"{where} processes[{i}] is not a named process{fix}")
            if not is_pid(p.get("pid")):
                raise ClusterStateError(f"{where} processes[{i}] ({p['name'][:40]!r}): pid "
                                        f"{str(repr(p.get('pid')))[:40]} is not a process id{fix}")
            ports = p.get("ports", [])
            if not isinstance(ports, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in ports):
                raise ClusterStateError(f"{where} processes[{i}] ({p['name'][:40]!r}): ports is not a list of "
                                        f"port numbers{fix}")
        cp = st.get("control_plane", {})
        if not isinstance(cp, dict) or not all(isinstance(v, dict) for v in cp.values()):
            raise ClusterStateError(f"{where} control_plane is not a mapping of process records{fix}")

    def process_records(self, st: dict | None = None) -> list[dict]:
        """The well-formed process entries of the state (anything else is never used)."""
        procs = (self.state() if st is None else st).get("processes")
        return [p for p in procs if isinstance(p, dict) and isinstance(p.get("name"), str) and is_pid(p.get("pid"))
                ] if isinstance(procs, list) else []

    def control_plane_records(self, st: dict | None = None) -> dict[str, dict]:
        cp = (self.state() if st is None else st).get("control_plane")
        return {k: v for k, v in cp.items() if isinstance(v, dict)} if isinstance(cp, dict) else {}

    # --- writing ------------------------------------------------------------------------------------------
    @contextmanager
    def _state_lock(self):
        """One read-modify-write of state.json at a time: the legs of a run (separate processes, and threads of
        one) register their processes on one cluster at once.  The lock file sits beside the cluster folder,
        which `down` removes."""
        path = self.folder.parent / f".{self.name}.state.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _save(self, st: dict) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_name(f"state.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(st, indent=2))
        os.replace(tmp, self.state_file)

    def update_state(self, **fields) -> None:
        """Fields of the cluster's record set (a change made to the running cluster, e.g. its controller swapped)."""
        self._update(**fields)

    def _update(self, **fields) -> None:
        with self._state_lock():
            st = self.state()
            st.update(fields)
            self._save(st)

    def register_process(self, name: str, pid: int, ports: list[int], log: Path | str) -> None:
        """Record a process the caller has just started for this cluster (its child, not yet reaped)."""
        try:
            group = os.getpgid(pid) == pid        # started in a session of its own: the product made that group
        except OSError:
            group = False
        rec = dict(identity(pid), name=name, group=group, ports=list(ports), log=str(log))
        with self._state_lock():
            st = self.state()
            st["processes"] = [p for p in self.process_records(st) if p["name"] != name] + [rec]
            self._save(st)

    def unregister_process(self, name: str) -> None:
        with self._state_lock():
            st = self.state()
            st["processes"] = [p for p in self.process_records(st) if p["name"] != name]
            self._save(st)

    def record_control_plane(self, names: list[str] | None = None) -> None:
        """Record the control-plane processes kwokctl (the product's child) has just started: those of its pid
        files that run and name this cluster's kwokctl folder."""
        pids = self._kwok_pids()
        with self._state_lock():
            st = self.state()
            cp = self.control_plane_records(st)
            for name, pid in pids.items():
                if (names is None or name in names) and pid_alive(pid) and self._names_kwok_dir(pid):
                    cp[name] = identity(pid)
            st["control_plane"] = cp
            self._save(st)

    # --- the processes ------------------------------------------------------------------------------------
    def marks(self) -> tuple[str, str]:
        """What the command line of every process the product starts for this cluster names."""
        return str(self.kubeconfig), str(self.folder) + "/"

    def kwok_marks(self) -> tuple[str]:
        return (str(self.kwok_dir) + "/",)

    def _names_kwok_dir(self, pid: int) -> bool:
        return self.kwok_marks()[0] in cmdline(pid)

    def _kwok_pids(self) -> dict[str, int]:
        """The control-plane processes kwokctl started, as its pid files say (not a proof of anything)."""
        out = {}
        pdir = self.kwok_dir / "pids"
        if pdir.is_dir():
            for f in pdir.glob("*.pid"):
                try:
                    pid = int(f.read_text()[:32].strip())
                except (ValueError, OSError, UnicodeDecodeError):
                    continue
                if is_pid(pid):
                    out[f.stem] = pid
        return out

    def control_plane(self) -> dict[str, tuple[int, dict | None]]:
        """name -> (pid of kwokctl's pid file, the record that proves it is ours or None).  A process with no
        record of its start (kwokctl started it again: a revival whose recorder was killed, a pid file written
        after the recorder looked) is ours too when it started after this cluster's start began, on this boot,
        and runs from this cluster's private kwokctl folder, whose pid file names it."""
        st = self.state()
        records = self.control_plane_records(st)
        began, boot = st.get("began_ticks"), st.get("boot_id")
        out = {}
        for name, pid in self._kwok_pids().items():
            rec = records.get(name)
            rec = rec if rec and rec.get("pid") == pid and proven(rec, self.kwok_marks()) else None
            if rec is None and isinstance(began, int) and not isinstance(began, bool) and boot == boot_id() \
                    and (start_time(pid) or -1) >= began and pid_alive(pid) and self._names_kwok_dir(pid):
                rec = identity(pid)
            out[name] = (pid, rec)
        return out

    def drop_unproven_pid_files(self) -> None:
        """Remove every kwokctl pid file that does not name a process the record proves (kwokctl signals what they
        name, and a pid file saying 0 or -1 would be a whole process group to it)."""
        proven_ = {name for name, (_, rec) in self.control_plane().items() if rec is not None}
        for f in (self.kwok_dir / "pids").glob("*.pid"):
            if f.stem not in proven_:
                f.unlink(missing_ok=True)

    def all_pids(self) -> list[int]:
        return [p["pid"] for p in self.process_records()] + list(self._kwok_pids().values())

    def own_processes(self) -> list[int]:
        """Running processes whose command line names this cluster's kubeconfig or folder (what is left of it
        after `down`, or what a lost state file no longer names).  Never signalled on that ground alone."""
        marks = [m.encode() for m in (*self.marks(), *self.kwok_marks())]
        out = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == os.getpid():
                continue
            try:
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if any(m in cmd for m in marks) and pid_alive(int(d.name)):
                out.append(int(d.name))
        return out

    @staticmethod
    def still_running(rec: dict) -> bool:
        """The recorded process has not exited (a zombie whose threads are gone has)."""
        return pid_alive(rec["pid"]) and start_time(rec["pid"]) == rec.get("start_time")


__all__ = ["ClusterState", "MAX_STATE_BYTES"]
