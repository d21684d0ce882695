"""The answer a person and a CI gate act on: does the prescription hold on this controller?

A verdict says whether an observation matched its expectation; what a row means for the prescription is said
apart.  Every assertion declares, where its lane records it (``Runbook.row``, ``load.record_phase_rows``):

- ``id``: ``lane/step/key``, stable however the sentence is worded; pairing (drills.reporting.upgrade), the matrix and
  upgrade-check use it, never the English sentence;
- ``polarity``: ``holds`` (evidence that the prescription works: AFTER keeps the weight at the last rung, the
  exit ends Healthy), ``hazard`` (evidence of exposure: the incident reproduced, BEFORE 100 on 1 of 2 pods, or a
  version hazard, which names the ``condition`` it needs, e.g. ``replicaProgressThreshold {type: Pods}``) or
  ``neutral``;
- ``shows``: whether the observation shows what the polarity names (the prescription held; the exposure
  happened), judged from the observation itself, never from a release's expectation (so a user-built
  controller's rows answer too); ``None`` without an observation (inconclusive, not applicable);
- ``fact``: the few words the headline says of it ("BEFORE 100 on 1 of 2 pods", "AFTER 5", "exit Healthy").

The headline per controller: ``no`` when a ``holds`` row shows the prescription failing, ``inconclusive`` when one
has no observation, ``yes`` when they held, with ``except with <condition> (<observed>)`` for every version hazard
seen; an incident hazard (no condition: the exposure the prescription removes) is context, never a ``no``.

Rows recorded before these fields existed: the id is the sentence with its source line references stripped (as
pairing always did), the polarity comes from LEGACY below.
"""
from __future__ import annotations

import fnmatch
import re

from ..core import config
from .ledger import (  # noqa: F401  (make_id: the one way an id is made, importable here)
    FAIL,
    HAZARD,
    HOLDS,
    INCONCLUSIVE,
    NEUTRAL,
    NOT_APPLICABLE,
    PASS,
    POLARITIES,
    UNVERIFIED,
    finite_number,
    make_id,
)
from ..core.steps import last_set_weight, parse_steps

YES, NO, OPEN, UNANSWERED = "yes", "no", "inconclusive", "not answered"
REAL = (PASS, FAIL, UNVERIFIED)

# a parenthetical naming only source lines (":245", "backward search :250, end-of-steps :266") or saying
# the lines are unknown
_LINE_PAREN_RE = re.compile(r"\s*\((?:[^()]*?:\d+[^()]*|lines unknown)\)")

# rows recorded before lanes declared a polarity: (lane, step, assertion pattern) -> polarity
LEGACY = (
    ("a", "before", "peak canary weight while*", HAZARD),
    ("a", "after", "peak canary weight while*", HOLDS),
    ("a", "exit", "promote --full clears abort*", HOLDS),
    ("a", "exit", "weight never above its value at promote --full*", HOLDS),
    ("a", "exit", "Healthy at v1 after promote --full*", HOLDS),
    ("*", "before", "load.exposure.failure_ratio", HAZARD),
    ("*", "after", "load.exposure.failure_ratio", HOLDS),
    ("order", "end-of-steps", "branch order: *", HOLDS),
    ("order", "mid-steps", "branch order: *", HOLDS),
    ("order", "hazard-*", "*", HAZARD),
)


# --- ids ---------------------------------------------------------------------------------------------------
def strip_line_refs(text: str) -> str:
    """An assertion without its source line references (each version names its own lines of one branch)."""
    return re.sub(r"\s{2,}", " ", _LINE_PAREN_RE.sub("", str(text))).strip()


def sentence_key(row: dict) -> str:
    return f"{row.get('lane')}/{row.get('step')}/{strip_line_refs(row.get('assertion') or '')}"


def keyer(*row_lists) -> callable:
    """row -> its pairing key: its id; a row recorded without one pairs with a row of the same sentence that has
    one, else by its sentence (line references stripped)."""
    ids = {sentence_key(r): r["id"] for rows in row_lists for r in rows if isinstance(r, dict) and r.get("id")}
    return lambda r: r.get("id") or ids.get(sentence_key(r)) or sentence_key(r)


def controller_label(row: dict) -> str:
    """A controller as every output names it: the release, or a user-built one's name (version + commit); with
    ``on <router>`` after it when its row was observed through a router other than Istio (the default)."""
    router = row.get("router")
    tail = f" on {router}" if isinstance(router, str) and router and router != "istio" else ""
    if row.get("controller_name"):
        return str(row["controller_name"]) + tail
    v = str(row.get("controller_version") or "unknown")
    sha = row.get("controller_sha256")
    return (f"{v} (sha256 {str(sha)[:12]})" if sha else v) + tail


# --- what lanes say of their observations ------------------------------------------------------------------
def exposed(weights_while_partial) -> bool | None:
    """Whether a canary weight in force while partial was above the share of pods available to carry it
    ([t, weight, available, target] entries); None without entries."""
    rows = [w for w in weights_while_partial or [] if isinstance(w, (list, tuple)) and len(w) >= 4]
    if not rows:
        return None
    return any(finite_number(w[1]) is not None and finite_number(w[3]) and
               w[1] > 100.0 * (finite_number(w[2]) or 0) / w[3] for w in rows)


def peak_fact(label: str, peak, weights_while_partial) -> str | None:
    """'BEFORE 100 on 1 of 2 pods' (the pods only when the weight was above their share), 'AFTER 5'."""
    if peak is None:
        return None
    text = f"{label} {peak:g}" if isinstance(peak, (int, float)) else f"{label} {peak}"
    at = [w for w in weights_while_partial or [] if isinstance(w, (list, tuple)) and len(w) >= 4 and w[1] == peak]
    if at and exposed(at):          # the pods that carried it: the most that were up while it was in force
        most = max(at, key=lambda w: finite_number(w[2]) or 0)
        text += f" on {most[2]} of {most[3]} pods"
    return text


def condition_of(extra_canary: dict | None) -> str | None:
    """The condition a version hazard needs, as the headline says it: 'replicaProgressThreshold {type: Pods}'."""
    extra_canary = extra_canary if isinstance(extra_canary, dict) else {}
    rpt = extra_canary.get("replicaProgressThreshold")
    if isinstance(rpt, dict):
        return f"replicaProgressThreshold {{type: {rpt.get('type')}}}"
    return ", ".join(f"{k} {v}" for k, v in extra_canary.items()) or None


def _details(row: dict) -> dict:
    d = row.get("details")
    return d if isinstance(d, dict) else {}


def _legacy_polarity(row: dict) -> str:
    lane, step, text = str(row.get("lane")), str(row.get("step")), strip_line_refs(row.get("assertion") or "")
    for pl, ps, pa, pol in LEGACY:
        if fnmatch.fnmatchcase(lane, pl) and fnmatch.fnmatchcase(step, ps) and fnmatch.fnmatchcase(text, pa):
            return pol
    return NEUTRAL


def _legacy_shows(row: dict, polarity: str) -> bool | None:
    d = _details(row)
    text = str(row.get("assertion") or "")
    if polarity == HAZARD and text.startswith("peak canary weight while"):
        return exposed(d.get("weights_while_partial"))
    if polarity == HAZARD and "prescription_holds" in d:
        return None if d["prescription_holds"] is None else not d["prescription_holds"]
    if polarity == HOLDS and text.startswith("peak canary weight while") and d.get("steps"):
        obs = finite_number(row.get("observed"))
        try:
            rung = last_set_weight(parse_steps(str(d["steps"])))
        except ValueError:
            rung = None
        return None if obs is None or rung is None else obs <= rung
    return {PASS: True, FAIL: False}.get(row.get("verdict"))


def _legacy_fact(row: dict) -> str | None:
    d = _details(row)
    step, text = row.get("step"), str(row.get("assertion") or "")
    if row.get("lane") == "a" and step in ("before", "after") and text.startswith("peak canary weight while"):
        return peak_fact(step.upper(), row.get("observed"), d.get("weights_while_partial"))
    if row.get("lane") == "a" and text.startswith("Healthy at v1 after promote --full"):
        return "exit Healthy" if row.get("verdict") == PASS else "exit not Healthy"
    return None


def declared(row: dict) -> dict:
    """id, polarity, shows, fact and condition of a row: as recorded, or derived for a row recorded without."""
    legacy = "polarity" not in row
    pol = row.get("polarity") if row.get("polarity") in POLARITIES else _legacy_polarity(row)
    shows = (_legacy_shows(row, pol) if legacy else row.get("shows")) if pol != NEUTRAL else None
    if row.get("verdict") not in REAL:
        shows = None
    cond = row.get("condition")
    if legacy and pol == HAZARD and row.get("lane") == "order":
        cond = condition_of(_details(row).get("extra_canary"))
    return {"id": row.get("id") or sentence_key(row), "polarity": pol, "shows": shows,
            "fact": _legacy_fact(row) if legacy else row.get("fact"), "condition": cond}


# --- the row that speaks for an id ----------------------------------------------------------------------------
WORST_FIRST = (FAIL, INCONCLUSIVE, UNVERIFIED, PASS, NOT_APPLICABLE)


def _run_of(row: dict) -> str:
    return str(row.get("shard_run_id") or row.get("run_id") or "")


def prevailing(rows: list[dict], key) -> dict:
    """key -> (index, row): the row that speaks for each key among ``rows`` (one controller's).  Rows of several
    runs: the newest run's (recorded_at, then order: a run again replaces an older one).  Several rows of one
    run with one key (a leg recorded an id twice, or a row was copied in): the worst verdict counts (fail,
    inconclusive, unverified, pass, not applicable), so a duplicated newer pass never hides a fail."""
    groups: dict = {}
    for i, r in enumerate(rows):
        groups.setdefault(key(r), []).append((i, r))
    out = {}
    for k, items in groups.items():
        newest = max(items, key=lambda x: (str(x[1].get("recorded_at") or ""), x[0]))
        same_run = [x for x in items if _run_of(x[1]) == _run_of(newest[1])]
        out[k] = min(same_run, key=lambda x: (WORST_FIRST.index(x[1].get("verdict"))
                                              if x[1].get("verdict") in WORST_FIRST else 0,
                                              -x[0]))
    return out


# --- the headline ------------------------------------------------------------------------------------------
def _newest(rows: list[dict]) -> list[dict]:
    return [r for _, r in sorted(prevailing(rows, keyer(rows)).values(), key=lambda x: x[0])]


def _fmt(v) -> str:
    f = finite_number(v)
    if f is not None:
        return f"{f:.4g}"
    return "—" if v is None else str(v)


def _ref(row: dict, d: dict, label: str | None = None) -> dict:
    return {"id": d["id"], "label": label or d["fact"] or d["condition"] or d["id"], "observed": row.get("observed"),
            "verdict": row.get("verdict"), "evidence": row.get("evidence"), "run_id": row.get("run_id")}


def _facts(pairs: list[tuple[dict, dict]]) -> str:
    """Facts in row order, per lane and variant: an incident's fact leads with an arrow to the next fact of the
    same measure (BEFORE's peak weight -> AFTER's)."""
    groups: dict[tuple, list] = {}
    for r, d in pairs:
        if d["fact"]:
            groups.setdefault((r.get("lane"), _details(r).get("variant")), []).append((r, d))
    out = []
    for items in groups.values():
        text = ""
        for i, (r, d) in enumerate(items):
            if i:
                prev, same = items[i - 1][1], items[i - 1][1]["id"].split("/", 2)[-1] == d["id"].split("/", 2)[-1]
                text += " → " if prev["polarity"] == HAZARD and not prev["condition"] and same else "; "
            text += d["fact"]
        out.append(text)
    return "; ".join(out)


def headline(rows: list[dict], label: str | None = None) -> dict:
    """The answer for one controller's rows (the newest row per id)."""
    rows = _newest([r for r in rows if isinstance(r, dict)])
    label = label or (controller_label(rows[0]) if rows else "unknown")
    pairs = [(r, declared(r)) for r in rows]
    holds = [(r, d) for r, d in pairs if d["polarity"] == HOLDS and r.get("verdict") != NOT_APPLICABLE]
    hazards = [(r, d) for r, d in pairs if d["polarity"] == HAZARD]
    failing = [(r, d) for r, d in holds if d["shows"] is False]
    unsure = [(r, d) for r, d in holds if d["shows"] is None]
    excepts = [(r, d) for r, d in hazards if d["condition"] and d["shows"] is True]
    held = [(r, d) for r, d in holds if d["shows"] is True]
    facts = _facts([(r, d) for r, d in pairs if d["polarity"] != NEUTRAL and d["shows"] is not None])
    if failing:
        answer = NO
        text = NO + ": " + "; ".join(d["fact"] or f"{d['id']} observed {_fmt(r.get('observed'))}"
                                      + (f" (expected {_fmt(r.get('expected'))})" if r.get("expected") is not None
                                         else "") for r, d in failing)
        others = _facts([(r, d) for r, d in pairs if d["polarity"] != NEUTRAL and d["shows"] is not None
                         and (r, d) not in failing])
        text += f" ({others})" if others else ""
    elif unsure:
        answer = OPEN
        text = OPEN + ": " + "; ".join(f"{d['id']}: {r.get('reason') or r.get('verdict')}" for r, d in unsure)
    elif held:
        answer = YES
        text = YES + (f" ({facts})" if facts else
                      " (" + ", ".join(dict.fromkeys(f"{r.get('lane')}/{r.get('step')}" for r, _ in held)) + " hold)")
    else:
        answer = UNANSWERED
        text = (UNANSWERED + ": no row of these lanes says whether it holds (lanes a and order do)"
                + (f"; {facts}" if facts else ""))
    if excepts and answer in (YES, UNANSWERED):
        text += (", except with " if answer == YES else "; hazard with ") + "; ".join(
            f"{d['condition']} ({_fmt(r.get('observed'))})" for r, d in excepts)
    evidence = [_ref(r, d) for r, d in pairs if d["polarity"] != NEUTRAL and (d["fact"] or (r, d) in failing
                                                                              or (r, d) in excepts
                                                                              or (r, d) in unsure)]
    return {"controller": label, "controller_version": rows[0].get("controller_version") if rows else None,
            "holds": answer, "text": f"prescription holds on {label}: {text}",
            "except": [_ref(r, d, d["condition"]) for r, d in excepts],
            "hazards": [_ref(r, d) for r, d in hazards if d["shows"] is True],
            "failing": [_ref(r, d) for r, d in pairs if r.get("verdict") == FAIL],
            "inconclusive": [_ref(r, d) for r, d in pairs if r.get("verdict") == INCONCLUSIVE],
            "evidence": evidence,
            "counts": {"holds": len(held), "does_not_hold": len(failing), "no_observation": len(unsure),
                       "hazards_seen": sum(1 for _, d in hazards if d["shows"] is True)}}


def headlines(rows: list[dict]) -> list[dict]:
    """One headline per controller in the rows, in version order."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        if isinstance(r, dict):
            by.setdefault(controller_label(r), []).append(r)
    return [headline(by[k], k) for k in config.version_order(by)]
