"""`drills toolchain` and `drills cluster`: what the commands do with their parsed arguments (drills.cli owns them).
A module of its own, apart from drills.commands.main: these commands never load the drill machinery (the lanes, the
recorder, the charts), only the toolchain and the embedded cluster; a test run calls them hundreds of times."""
from __future__ import annotations

import json
from pathlib import Path

from ..cluster import ClusterError, ClusterInputError, EmbeddedCluster, remains
from ..core.errors import EXIT_FAIL, EXIT_OK, BadInput, err
from ..toolchain import BuildError, Toolchain, components_for, resolve_controller_versions
from ..toolchain.components import optional_components


# --- toolchain -------------------------------------------------------------------------------
def _extras_arg(spec: str | None) -> list[str]:
    known = list(optional_components())
    extras = [e.strip() for e in (spec or "").split(",") if e.strip()]
    unknown = [e for e in extras if e not in known]
    if unknown:
        raise BadInput(f"--extra: unknown component(s) {', '.join(unknown)} (known: {', '.join(known)})")
    return extras


def cmd_toolchain_build(args, log) -> int:
    versions = resolve_controller_versions(args.controller)
    if args.jobs is not None and not 1 <= args.jobs <= 8:
        raise BadInput(f"-j {args.jobs}: give 1 to 8 components at a time")
    reuse = Path(args.reuse).expanduser().absolute() if args.reuse and args.reuse.strip() else None
    if args.reuse is not None and not (reuse and reuse.is_dir()):
        raise BadInput(f"--reuse {args.reuse!r}: not a folder (give a drills cache, e.g. a builder's cache mount)")
    tc = Toolchain(reuse=reuse)
    try:
        tc.ensure(components_for(versions, _extras_arg(args.extra)), jobs=args.jobs)
    except BuildError as e:
        err(str(e))
        return EXIT_FAIL
    print(f"toolchain ready in {tc.root}: controllers {', '.join(versions)}")
    return EXIT_OK


def cmd_toolchain_list(args, log) -> int:
    rows = Toolchain().listing()
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    print(f"{'component':<12} {'version':<10} {'built':<6} {'supported':<9} path")
    for r in rows:
        print(f"{r['component']:<12} {r['version']:<10} {'yes' if r['built'] else 'no':<6} "
              f"{'yes' if r['supported'] else 'no':<9} {r['path'] or ''}")
    return EXIT_OK


# --- cluster ----------------------------------------------------------------------------------
def one_version(spec: str | None) -> str:
    versions = resolve_controller_versions(spec)
    if len(versions) != 1:
        raise BadInput("give one controller version")
    return versions[0]


def cmd_cluster_up(args, log) -> int:
    if args.api_port is not None and not 1024 <= args.api_port <= 65535:
        raise BadInput(f"--api-port {args.api_port}: give a port in 1024..65535")
    version = one_version(args.controller)
    remains.reap(log)                   # the clusters a killed run left
    try:
        st = EmbeddedCluster().up(version, build=not args.no_build, api_port=args.api_port)
    except ClusterInputError as e:
        raise BadInput(str(e).splitlines()[0])
    except (ClusterError, BuildError) as e:
        err(str(e))
        return EXIT_FAIL
    print(json.dumps({k: st.get(k) for k in ("ready", "controller_version", "kubeconfig", "api_server")}))
    return EXIT_OK


def cmd_cluster_status(args, log) -> int:
    c = EmbeddedCluster()
    try:
        c.check_state()
    except ClusterInputError as e:
        raise BadInput(str(e)) from None
    st = c.status()
    if args.json:
        print(json.dumps(st, indent=2))
    elif "processes" not in st:
        print(st.get("error") or "no embedded cluster")
    else:
        print(f"cluster {st['cluster']}: {'ready' if st['ready'] else 'NOT ready'}, controller "
              f"{st['controller_version']}, api {st['api_server']}, kubeconfig {st['kubeconfig']}")
        for p in st["processes"]:
            print(f"  {p['name']:<24} pid {p['pid']:<8} {'alive' if p['alive'] else 'dead':<6} "
                  f"ports {','.join(map(str, p.get('ports') or [])) or '-'}  log {p.get('log')}")
    return EXIT_OK if st.get("ready") else EXIT_FAIL


def cmd_cluster_down(args, log) -> int:
    EmbeddedCluster().down()
    return EXIT_OK
