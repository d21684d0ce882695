"""The cluster's state file under concurrent writers: every leg of a run (a process of its own, threads inside)
registers the processes it starts on one cluster, and none of those records may be lost -- `down` stops what
the state names."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading

from drills.core import config
from drills.cluster import EmbeddedCluster

WRITER = """
import sys, threading
from drills.cluster import EmbeddedCluster
c = EmbeddedCluster(sys.argv[1])
def one(t):
    for i in range(int(sys.argv[3])):
        c.register_process(f"{sys.argv[2]}-{t}-{i}", 1, [], "/dev/null")
ts = [threading.Thread(target=one, args=(t,)) for t in range(3)]
[t.start() for t in ts]
[t.join() for t in ts]
"""


def test_concurrent_registrations_from_processes_and_threads_are_all_kept():
    name = f"state-{os.getpid()}"
    c = EmbeddedCluster(name)
    c._save({"name": name, "processes": []})
    try:
        procs = [subprocess.Popen([sys.executable, "-c", WRITER, name, f"p{i}", "15"], cwd=str(config.project_root()),
                                  stderr=subprocess.PIPE, text=True) for i in range(4)]
        local = [threading.Thread(target=lambda t=t: [c.register_process(f"local-{t}-{i}", 1, [], "/dev/null")
                                                      for i in range(15)]) for t in range(2)]
        [t.start() for t in local]
        errors = [p.communicate(timeout=120)[1] for p in procs]
        [t.join() for t in local]
        assert all(p.returncode == 0 for p in procs), errors
        names = [p["name"] for p in c.state()["processes"]]
        assert len(names) == len(set(names)) == 4 * 3 * 15 + 2 * 15
        c.unregister_process("local-0-0")
        assert "local-0-0" not in [p["name"] for p in c.state()["processes"]]
        assert not list(c.folder.glob("*.tmp"))
    finally:
        shutil.rmtree(c.folder, ignore_errors=True)
