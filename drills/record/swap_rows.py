"""Lane swap's rows as an upgrade check reads them: one line per (pair, state), the worst verdict first.

A swap row is no change between two sides (upgrade.classify pairs rows of one version with rows of the other); it
is a verdict of its own on a version pair, with a direction (drills.lanes.swap).  ``upgrade.json`` carries them
under ``swap``, the report and the console show them before the change table, and they gate the exit as any
ledger row does (a fail 1, an inconclusive 3)."""
from __future__ import annotations

from .ledger import FAIL, INCONCLUSIVE, PASS, exit_code

LANE = "swap"
ORDER = {FAIL: 0, INCONCLUSIVE: 1, PASS: 3}


def pair_of(row: dict) -> str | None:
    d = row.get("details") if isinstance(row.get("details"), dict) else {}
    return d.get("pair") if isinstance(d.get("pair"), str) else None


def swap_rows(rows: list[dict], pairs: set[str]) -> list[dict]:
    """The rows of lane swap on one of ``pairs`` ("<from>-><to>")."""
    return [r for r in rows if r.get("lane") == LANE and pair_of(r) in pairs]


def summarise(rows: list[dict]) -> list[dict]:
    """One entry per (pair, state) in the order met: the worst verdict, each assertion's verdict, observed value
    and reason."""
    out: dict[tuple, dict] = {}
    for r in rows:
        key = (pair_of(r), str(r.get("step")))
        e = out.setdefault(key, {"pair": key[0], "state": key[1], "verdict": PASS, "assertions": {}})
        v, name = r.get("verdict"), str(r.get("assertion"))
        held = e["assertions"].get(name)
        if held is None or _worse(v, held["verdict"]):      # of two rows of one assertion, the worse counts
            e["assertions"][name] = {"verdict": v, "expected": r.get("expected"), "observed": r.get("observed"),
                                     "reason": r.get("reason")}
        if _worse(v, e["verdict"]):
            e["verdict"] = v
    return sorted(out.values(), key=lambda e: ORDER.get(e["verdict"], 2))


def _worse(v, than) -> bool:
    """fail, then inconclusive, then any other verdict but pass, then pass."""
    rank = lambda x: ORDER.get(x, 2 if x != PASS else 3)      # noqa: E731
    return rank(v) < rank(than)


def line(e: dict) -> str:
    """A console line of one (pair, state)."""
    bad = {k: a for k, a in e["assertions"].items() if a["verdict"] != PASS}
    said = "; ".join(f"{k}: {a['verdict']}" + (f" ({a['reason']})" if a.get("reason") else "") for k, a in bad.items())
    return (f"swap {e['pair']} {e['state']}: {e['verdict']}"
            + (f" -- {said}" if said else f" ({len(e['assertions'])} assertions)"))


def gate(rows: list[dict]) -> int:
    return exit_code(rows)
