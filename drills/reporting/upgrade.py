"""Upgrade classification: a candidate controller's ledger rows against a baseline's, change by change.

Rows pair by their assertion's stable id (``lane/step/key``, drills.record.answer), however the sentence is worded; a
row recorded without an id pairs by (lane, step, assertion), the assertion normalised first: a parenthetical that
only names source lines -- ``(:245)``, ``(backward search :250, end-of-steps :266)``, ``(lines unknown)`` -- is
dropped, because every version names its own lines of the same branch (the original texts stay on each Change).
Each pair gets one class, judged by its assertion's declared direction (fixtures/upgrade/directions.yaml,
described there):

- ``same`` / ``improved`` / ``regressed`` / ``changed`` (neither better nor worse by that direction);
- ``new``: a real observation (pass, fail, unverified) on the candidate only -- the baseline has no row or
  records the assertion ``not_applicable``; ``gone``: the reverse (a ``gone`` whose candidate has no row at all
  is missing evidence: the upgrade-check is inconclusive);
- ``inconclusive``: either side inconclusive (never ``same``).

The directions are data, next to the lanes' other fixtures (expectations, thresholds): adding an assertion
and saying which way is better are one edit in one place, readable without the code, and validated on load
(an unknown direction or key is an error, and the last entry matches every row, so none is undeclared).

Which rows gate (``Change.gates``): every row but a load figure -- the prescription's traffic-weight rows (lane a's
peak weights and exit, lane order's probes and hazard rows), the other lanes' states, the scan's predictions.  A
load figure (an assertion ``load.<phase>.<metric>``: the failed-request ratio and p95 latency Locust measured through
the emulated mesh) is informational: it moves with the machine's load from one run to the next, and the traffic
weight it follows is gated by its own rows.  Within its noise band (its declaration's tolerance:
fixtures/upgrade/directions.yaml) it is ``same``; outside it, ``changed``, never ``regressed`` or ``improved``
(its words say which way and by how much); and whatever its class (inconclusive, new, gone) it never sets the exit.

Exit rule (DESIGN.md §6 precedence), on the rows that gate: 2 bad input > 1 something regressed, or the candidate
shows a hazard the baseline lacks (a ``hazard`` row whose exposure the candidate shows and the baseline does not,
or a ``new`` or ``changed`` hazard row the candidate shows: whatever its class) > 3 a pair or leg inconclusive, or a
row of the baseline the candidate lacks > 0.  Of several rows with one id on one side, the newest run's counts, and of one
run's duplicates the worst verdict (drills.record.answer.prevailing).
"""
from __future__ import annotations

import fnmatch
import string
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..core import config, fastyaml
from ..record.answer import HAZARD, controller_label, declared, keyer, prevailing, strip_line_refs
from ..lanes import REGISTRY
from ..record.ledger import FAIL, INCONCLUSIVE, NOT_APPLICABLE, PASS, UNVERIFIED, VERDICTS, finite_number

SAME, IMPROVED, REGRESSED, CHANGED, NEW, GONE = "same", "improved", "regressed", "changed", "new", "gone"
INCONCLUSIVE_PAIR = "inconclusive"
CLASSES = (REGRESSED, INCONCLUSIVE_PAIR, NEW, IMPROVED, CHANGED, GONE, SAME)   # table order

LOWER_IS_BETTER, ORDER_MUST_HOLD, VERDICT = "lower_is_better", "order_must_hold", "verdict"
DIRECTIONS = (LOWER_IS_BETTER, ORDER_MUST_HOLD, VERDICT)
REAL = (PASS, FAIL, UNVERIFIED)           # verdicts that carry an observation

EXIT_OK, EXIT_REGRESSED, EXIT_BAD_INPUT, EXIT_INCONCLUSIVE = 0, 1, 2, 3

LOAD_PREFIX = "load."         # a load figure's assertion: informational, never gates
INFORMATIONAL_RULE = ("load figures (load.<phase>.<metric>: failed-request ratio and p95 latency through the emulated "
                      "mesh) are informational and never gate the exit: within their noise band (failure ratio "
                      "{ratio}, p95 {p95}) they are same, outside it changed; every other row gates, and so does "
                      "the answer: the prescription does not hold on the candidate (its headline: no), exit 1")


def is_load(assertion: str) -> bool:
    return str(assertion).startswith(LOAD_PREFIX)


class UpgradeInputError(ValueError):
    """Rows or declarations that cannot be classified (exit 2)."""


def directions_file() -> Path:
    return config.fixtures_dir() / "upgrade" / "directions.yaml"


def normalise_assertion(text: str) -> str:
    """The assertion without its source line references: the pairing key across versions (rows without ids)."""
    return strip_line_refs(text)


# --- declarations ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Declaration:
    lane: str
    steps: tuple
    assertion: str
    direction: str
    tol_abs: float = 0.0
    tol_rel: float = 0.0
    danger_field: str | None = None
    danger_equals: object = None
    danger_words: str | None = None

    def matches(self, lane: str, step: str, assertion: str) -> bool:
        return (fnmatch.fnmatchcase(lane, self.lane) and any(fnmatch.fnmatchcase(step, s) for s in self.steps)
                and fnmatch.fnmatchcase(assertion, self.assertion))


_KEYS = {"lane", "step", "assertion", "direction", "tolerance", "danger"}


def load_directions(path: Path | None = None) -> list[Declaration]:
    p = Path(path or directions_file())
    try:
        data = fastyaml.safe_load(p.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise UpgradeInputError(f"{p}: cannot read the direction declarations: {e}")
    out = []
    for i, d in enumerate(data.get("directions") or []):
        where = f"{p}: directions[{i}]"
        if not isinstance(d, dict) or set(d) - _KEYS:
            raise UpgradeInputError(f"{where}: unknown keys {sorted(set(d) - _KEYS) if isinstance(d, dict) else d}")
        if d.get("direction") not in DIRECTIONS:
            raise UpgradeInputError(f"{where}: direction {d.get('direction')!r} is not one of {', '.join(DIRECTIONS)}")
        steps = d.get("step", "*")
        tol = d.get("tolerance") or {}
        danger = d.get("danger") or {}
        if set(tol) - {"abs", "rel"} or (danger and (set(danger) != {"when", "words"} or
                                                     set(danger["when"]) != {"field", "equals"})):
            raise UpgradeInputError(f"{where}: tolerance takes abs/rel; danger takes when {{field, equals}} and words")
        out.append(Declaration(
            lane=str(d.get("lane", "*")), steps=tuple(map(str, steps if isinstance(steps, list) else [steps])),
            assertion=str(d.get("assertion", "*")), direction=d["direction"], tol_abs=float(tol.get("abs", 0)),
            tol_rel=float(tol.get("rel", 0)), danger_field=(danger.get("when") or {}).get("field"),
            danger_equals=(danger.get("when") or {}).get("equals"), danger_words=danger.get("words")))
    if not out or not out[-1].matches("any-lane", "any-step", "any assertion"):
        raise UpgradeInputError(f"{p}: the last declaration must match every row (lane, step, assertion '*')")
    return out


def declaration_for(lane: str, step: str, assertion: str, decls: list[Declaration]) -> Declaration:
    return next(d for d in decls if d.matches(lane, step, normalise_assertion(assertion)))


# --- changes --------------------------------------------------------------------------------------------
@dataclass
class Change:
    lane: str
    step: str
    assertion: str                      # normalised (the pairing key)
    cls: str
    direction: str
    words: str
    baseline: dict | None = None
    candidate: dict | None = None
    danger: bool = False
    id: str | None = None               # the assertion's stable id (lane/step/key)
    polarity: str = "neutral"

    @property
    def gates(self) -> bool:
        """Whether this pair can set the exit: every row but a load figure (informational)."""
        return not is_load(self.assertion)

    @property
    def new_hazard(self) -> bool:
        """The candidate shows a hazard the baseline lacks: its exposure seen on the candidate and not on the
        baseline, or a new or changed hazard row the candidate shows -- whatever the pair's class.  The baseline
        must have said something of it (an observation, or not applicable): a baseline row that is missing or
        inconclusive is missing evidence (inconclusive), not the hazard's absence."""
        if not self.gates or self.polarity != HAZARD or self.candidate is None or \
                declared(self.candidate)["shows"] is not True:
            return False
        if self.baseline is None or self.baseline.get("verdict") not in (*REAL, NOT_APPLICABLE):
            return False
        return declared(self.baseline)["shows"] is not True or self.cls in (NEW, CHANGED)

    @property
    def key(self) -> tuple[str, str, str]:
        return self.lane, self.step, self.assertion

    @property
    def baseline_assertion(self) -> str | None:
        return (self.baseline or {}).get("assertion")

    @property
    def candidate_assertion(self) -> str | None:
        return (self.candidate or {}).get("assertion")

    def as_dict(self) -> dict:
        def side(r):
            return None if r is None else {k: r.get(k) for k in (
                "controller_version", "controller_sha256", "run_id", "assertion", "expected", "observed", "verdict",
                "reason", "evidence")}
        return {"class": self.cls, "id": self.id, "lane": self.lane, "step": self.step, "assertion": self.assertion,
                "polarity": self.polarity, "new_hazard": self.new_hazard, "gates": self.gates,
                "direction": self.direction, "words": self.words, "danger": self.danger,
                "baseline": side(self.baseline), "candidate": side(self.candidate)}


def column_of(row: dict) -> str:
    """A controller as the matrix names it: the release, or a user-built one's name (version plus commit)."""
    return controller_label(row)


def _index(rows, side: str, key=None) -> dict[str, dict]:
    """Rows by pairing key (their id); of several rows with one key the one that prevails (drills.record.answer): the
    newest run's, and of one run's duplicates the worst verdict, so a duplicated newer pass never hides a fail."""
    if not isinstance(rows, (list, tuple)):
        raise UpgradeInputError(f"{side} rows: expected a list of ledger rows, got {type(rows).__name__}")
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise UpgradeInputError(f"{side} row {i}: not a ledger row ({type(r).__name__})")
        missing = [k for k in ("lane", "step", "assertion", "verdict") if not r.get(k)]
        if missing:
            raise UpgradeInputError(f"{side} row {i}: missing {', '.join(missing)}")
        if r["verdict"] not in VERDICTS:
            raise UpgradeInputError(f"{side} row {i}: unknown verdict {r['verdict']!r}")
    return {k: v[1] for k, v in prevailing(rows, key or keyer(rows)).items()}



def _field(row: dict, dotted: str):
    cur = row
    for part in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


class _Formatter(string.Formatter):
    """Danger words name row fields; a field a row lacks reads "not recorded"."""

    def get_field(self, field_name, args, kwargs):
        try:
            return super().get_field(field_name, args, kwargs)
        except (KeyError, IndexError, TypeError, AttributeError):
            return None, field_name

    def format_field(self, value, format_spec):
        if value is None:
            return "not recorded"
        if isinstance(value, dict):
            value = "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
        return super().format_field(value, format_spec)


def _fmt(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _reason(r: dict | None) -> str:
    if r is None:
        return "no row"
    return f"{r['verdict']}" + (f": {r['reason']}" if r.get("reason") else "")


def _verdict_class(b: dict, c: dict) -> tuple[str, str]:
    vb, vc = b["verdict"], c["verdict"]
    if vb in (PASS, FAIL) and vc in (PASS, FAIL):
        if vb == vc:
            return SAME, f"{vb} on both"
        return (REGRESSED, "pass -> fail") if vc == FAIL else (IMPROVED, "fail -> pass")
    if b.get("observed") == c.get("observed"):
        return SAME, f"observed {_fmt(c.get('observed'))} on both ({vb} / {vc})"
    return CHANGED, f"observed {_fmt(b.get('observed'))} -> {_fmt(c.get('observed'))} ({vb} / {vc})"


def band(d: Declaration) -> str:
    """A declaration's tolerance in words: '±0.01', '±50 ms or 50% of the larger' (a load latency's unit)."""
    unit = " ms" if d.assertion.endswith("_ms") else ""
    parts = ([f"±{_fmt(d.tol_abs)}{unit}"] if d.tol_abs else []) + ([f"{_fmt(d.tol_rel * 100)}% of the larger"]
                                                                    if d.tol_rel else [])
    return " or ".join(parts) or "none"


def _lower_class(b: dict, c: dict, d: Declaration, informational: bool = False) -> tuple[str, str]:
    ob, oc = finite_number(b.get("observed")), finite_number(c.get("observed"))
    if ob is None or oc is None:
        return _verdict_class(b, c)
    diff = oc - ob
    allowed = max(d.tol_abs, d.tol_rel * max(abs(ob), abs(oc)))
    text = f"{_fmt(b.get('observed'))} -> {_fmt(c.get('observed'))} (lower is better"
    if diff == 0:
        return SAME, f"{_fmt(c.get('observed'))} on both"
    if informational:
        if abs(diff) <= allowed:
            return SAME, f"{text}; within the noise band {band(d)})"
        return CHANGED, (f"{text}: {'better' if diff < 0 else 'worse'} by {_fmt(abs(diff))}, outside the noise band "
                         f"{band(d)}; a load figure: informational, never gates)")
    if abs(diff) <= allowed:
        return SAME, f"{text}; within the tolerance {_fmt(allowed)})"
    return (IMPROVED if diff < 0 else REGRESSED), text + ")"


def _order_class(b: dict, c: dict) -> tuple[str, str]:
    opposite = ((c.get("details") or {}).get("opposite_order_would_show")
                if (c.get("details") or {}).get("opposite_order_would_show") is not None
                else (b.get("details") or {}).get("opposite_order_would_show"))
    ob, oc = b.get("observed"), c.get("observed")
    if opposite is None:
        return _verdict_class(b, c)
    if ob == oc:
        return SAME, f"observed {_fmt(oc)} on both (the opposite order would show {_fmt(opposite)})"
    flipped_b, flipped_c = ob == opposite, oc == opposite
    if flipped_c and not flipped_b:
        return REGRESSED, (f"the branch order flipped: {_fmt(ob)} -> {_fmt(oc)}, what the opposite order shows; "
                           f"the prescription's precondition (backward search first) no longer holds")
    if flipped_b and not flipped_c:
        return IMPROVED, f"{_fmt(ob)} (the opposite order) -> {_fmt(oc)}: the backward search is first again"
    return CHANGED, f"{_fmt(ob)} -> {_fmt(oc)} (neither is the opposite order's {_fmt(opposite)})"


def _pair(key: str, b: dict | None, c: dict | None, decls: list[Declaration]) -> Change:
    either = c if c is not None else b
    lane, step, assertion = str(either["lane"]), str(either["step"]), normalise_assertion(either["assertion"])
    d = declaration_for(lane, step, assertion, decls)
    real_b = b is not None and b["verdict"] in REAL
    real_c = c is not None and c["verdict"] in REAL
    if (b is not None and b["verdict"] == INCONCLUSIVE) or (c is not None and c["verdict"] == INCONCLUSIVE):
        which = [f"{s}: {_reason(r)}" for s, r in (("baseline", b), ("candidate", c))
                 if r is not None and r["verdict"] == INCONCLUSIVE]
        cls, words = INCONCLUSIVE_PAIR, "inconclusive (" + "; ".join(which) + ")"
    elif real_c and not real_b:
        cls, words = NEW, (f"observed {_fmt(c.get('observed'))} ({c['verdict']}) on the candidate only; "
                           f"baseline: {_reason(b)}")
    elif real_b and not real_c:
        cls, words = GONE, (f"observed {_fmt(b.get('observed'))} ({b['verdict']}) on the baseline only; "
                            f"candidate: {_reason(c)}")
    elif not real_b and not real_c:
        cls, words = SAME, f"no observation on either side ({_reason(b)} / {_reason(c)})"
    elif d.direction == LOWER_IS_BETTER:
        cls, words = _lower_class(b, c, d, informational=is_load(assertion))
    elif d.direction == ORDER_MUST_HOLD:
        cls, words = _order_class(b, c)
    else:
        cls, words = _verdict_class(b, c)
    if is_load(assertion) and cls in (IMPROVED, REGRESSED):      # a load figure is never judged better or worse
        cls, words = CHANGED, f"{words}; a load figure: informational, never gates"
    danger = False
    if d.danger_words and c is not None and cls in (NEW, REGRESSED, CHANGED) \
            and _field(c, d.danger_field) == d.danger_equals:
        danger = True
        ctx = {"baseline": b or {}, "candidate": c}
        words = _Formatter().vformat(" ".join(d.danger_words.split()), (), ctx)
    return Change(lane, step, assertion, cls, d.direction, words, b, c, danger, id=key,
                  polarity=declared(either)["polarity"])


def _one_controller(idx: dict, side: str) -> None:
    cols = config.version_order({column_of(r) for r in idx.values() if r.get("controller_version")})
    if len(cols) > 1:
        raise UpgradeInputError(f"{side} rows come from more than one controller: {', '.join(cols)}")


def classify(baseline_rows: list[dict], candidate_rows: list[dict],
             directions: list[Declaration] | None = None) -> list[Change]:
    """Pair every (lane, step, assertion) of two controllers' rows and classify each pair."""
    decls = directions if directions is not None else load_directions()
    key = keyer(*(x for x in (baseline_rows, candidate_rows) if isinstance(x, (list, tuple))))
    b_idx, c_idx = _index(baseline_rows, "baseline", key), _index(candidate_rows, "candidate", key)
    _one_controller(b_idx, "baseline")
    _one_controller(c_idx, "candidate")
    order: dict[tuple, int] = {}
    for i, k in enumerate(list(b_idx) + list(c_idx)):
        order.setdefault(k, i)
    return [_pair(k, b_idx.get(k), c_idx.get(k), decls) for k in sorted(order, key=order.get)]


@dataclass
class NeighbourStep:
    """The changes from one tested version to the next one (the matrix's release history)."""
    from_column: str
    to_column: str
    changes: list[Change] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return count_classes(self.changes)


def classify_neighbours(rows: list[dict], versions: list[str] | None = None,
                        directions: list[Declaration] | None = None) -> list[NeighbourStep]:
    """Classify each tested release against the previous one in a merged ledger (several runs allowed).

    ``versions``: the releases in order (default: every release column of the rows, by version).  Rows of
    user-built controllers (with a sha256) take no part: they are compared against a baseline instead.  Each
    router's rows make a history of their own (Istio's first; another's columns say ``on <router>``)."""
    decls = directions if directions is not None else load_directions()
    by_router: dict[str, dict[str, list[dict]]] = {}
    for r in rows:
        if isinstance(r, dict) and r.get("controller_version") and not r.get("controller_sha256"):
            router = str(r.get("router") or "istio")
            by_router.setdefault(router, {}).setdefault(str(r["controller_version"]), []).append(r)
    out = []
    for router in sorted(by_router, key=lambda x: (x != "istio", x)):
        by_col, tail = by_router[router], ("" if router == "istio" else f" on {router}")
        present = [v for v in (versions if versions is not None else config.version_order(by_col)) if v in by_col]
        out += [NeighbourStep(a + tail, b + tail, classify(by_col[a], by_col[b], decls))
                for a, b in zip(present, present[1:])]
    return out


def count_classes(changes: list[Change]) -> dict[str, int]:
    return {c: sum(1 for ch in changes if ch.cls == c) for c in CLASSES}


def new_hazards(changes: list[Change]) -> list[Change]:
    """The hazards the candidate shows and the baseline lacks (each one gates the upgrade)."""
    return [c for c in changes if c.new_hazard]


def missing_on_candidate(changes: list[Change]) -> list[Change]:
    """The baseline's observations the candidate has no row for (``gone`` without a candidate row): the row set
    the baseline shows is what the candidate is expected to show, so each is missing evidence, never a go (a load
    figure is informational: its absence is said, never gated on)."""
    return [c for c in changes if c.cls == GONE and c.candidate is None and c.gates]


def informational(changes: list[Change], decls: list[Declaration] | None = None) -> dict:
    """What upgrade.json and the console say of the rows that never gate: the rule with its noise bands, how many
    there are, their classes, and the ids of those outside their band (changed) or without an answer."""
    decls = decls if decls is not None else load_directions()
    info = [c for c in changes if not c.gates]
    rule = INFORMATIONAL_RULE.format(
        ratio=band(declaration_for("*", "*", "load.exposure.failure_ratio", decls)),
        p95=band(declaration_for("*", "*", "load.exposure.p95_ms", decls)))
    return {"rule": rule, "rows": len(info), "counts": count_classes(info),
            "outside_noise_band": [c.id for c in info if c.cls == CHANGED],
            "without_answer": [c.id for c in info if c.cls in (INCONCLUSIVE_PAIR, GONE, NEW)]}


def exit_code(changes: list[Change], inconclusive_legs: int = 0) -> int:
    """On the rows that gate (every row but a load figure): 1 something regressed or a new hazard > 3 a pair or
    leg inconclusive, or a baseline row the candidate lacks (missing_on_candidate) > 0 (bad input, 2, is raised as
    UpgradeInputError)."""
    classes = {c.cls for c in changes if c.gates}
    if REGRESSED in classes or new_hazards(changes):
        return EXIT_REGRESSED
    if INCONCLUSIVE_PAIR in classes or inconclusive_legs or missing_on_candidate(changes):
        return EXIT_INCONCLUSIVE
    return EXIT_OK


def _sort_key(ch: Change):
    """Changes in table order: by class, then in lane order (the registry's: drills.lanes, lanes of other packages
    after the built-in ones), then step and assertion; a lane no longer registered goes last."""
    order = list(REGISTRY)
    return (CLASSES.index(ch.cls), order.index(ch.lane) if ch.lane in order else len(order), ch.lane, ch.step,
            ch.assertion)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _cell(row: dict | None) -> str:
    if row is None:
        return "no row"
    return "n/a" if row["verdict"] == NOT_APPLICABLE else _fmt(row.get("observed"))


def hazard_lines(changes: list[Change]) -> list[str]:
    """One line per hazard the candidate shows and the baseline lacks: what it is, what was seen, the evidence."""
    out = []
    for c in new_hazards(changes):
        k = c.candidate or {}
        cond = declared(k)["condition"]
        what = c.words if c.danger else (f"{c.assertion}: observed {_fmt(k.get('observed'))} on the candidate; "
                                         f"baseline: {_cell(c.baseline)} ({_reason(c.baseline)})")
        out.append(f"!! HAZARD on {column_of(k)} that {column_of(c.baseline) if c.baseline else 'the baseline'} "
                   f"lacks{f' (with {cond})' if cond else ''}: {what} [{c.id}, {c.cls}"
                   + (f"; evidence {k['evidence']}" if k.get("evidence") else "") + "]")
    return out


def changes_table(changes: list[Change], include_same: bool = False, width: int = 160) -> str:
    """A plain-text table, changes first (regressed, inconclusive, new, improved, changed, gone), with
    each change's words; same rows are counted, and listed only with ``include_same``."""
    cols_b = sorted({column_of(c.baseline) for c in changes if c.baseline})
    cols_c = sorted({column_of(c.candidate) for c in changes if c.candidate})
    counts = count_classes(changes)
    head = (f"{' / '.join(cols_b) or '—'} -> {' / '.join(cols_c) or '—'}: "
            + ", ".join(f"{n} {c}" for c, n in counts.items()))
    shown = sorted((c for c in changes if include_same or c.cls != SAME), key=_sort_key)
    lines = [head]
    if not shown:
        lines.append("no changes" if changes else "no rows")
        return "\n".join(lines) + "\n"
    hdr = ("class", "lane", "step", "baseline", "candidate", "assertion")
    data = [(c.cls, c.lane, c.step, _cell(c.baseline), _cell(c.candidate), c.assertion) for c in shown]
    w = [max(len(hdr[i]), *(min(len(str(d[i])), 34) for d in data)) for i in range(5)]
    fmt_row = lambda r: "  ".join(_clip(str(r[i]), w[i]).ljust(w[i]) for i in range(5)) + "  " + str(r[5])  # noqa: E731
    lines.append(_clip(fmt_row(hdr), width))
    for c, r in zip(shown, data):
        lines.append(_clip(fmt_row(r), width))
        mark = "!! " if c.danger else ("(informational) " if not c.gates else "")
        lines.append(" " * 4 + mark + c.words)
    if not include_same and counts[SAME]:
        lines.append(f"({counts[SAME]} same, not listed)")
    outside = sum(1 for c in changes if not c.gates and c.cls != SAME)
    if outside:
        lines.append(f"{outside} load figure(s) not same: informational, never gate the exit (upgrade.json: "
                     f"informational)")
    return "\n".join(lines) + "\n"
