"""Reports: timeline plots, per-run report, version x assertion matrix, `drills report`."""
from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest

from drills.cli import build_parser
from drills.commands.main import cmd_report
from drills.core.errors import BadInput
from drills.record.ledger import Ledger
from drills.record.plots import plot_series
from drills.reporting.report import EMULATION_NOTE, WEIGHT_NOTE, write_matrix, write_run_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def series_doc(title="lane a BEFORE rollback (v1.8.2)", exposure=((6.3, 9.7),), load=False, phases=False):
    doc = {
        "title": title, "t0_wall": 1764438000.123,
        "canary_weight": [[-6, 0], [6.3, 100], [18.7, 0]],
        "stable_weight": [[-6, 100], [6.3, 0], [18.7, 100]],
        "canary_available": [[-6, 0, 0], [0.2, 0, 1], [4.4, 1, 1], [5.2, 1, 2], [9.7, 2, 2]],
        "partial": [[0.2, 4.4], [5.2, 9.7]],
        "exposure": [list(w) for w in exposure],
        "markers": [[0, "rollback"], [10.5, "promote --full"]],
        "summary": {"peak_canary_weight_while_partial": 100, "partial_window_observed": True,
                    "exposure_seconds": sum((b or 20) - a for a, b in exposure)},
    }
    if phases or load:
        doc["phases"] = {"steady": [-6, 0], "exposure": [6.3, 9.7], "settled": [9.7, 20]}
    if load:
        doc["load"] = {"steady": {"failure_ratio": 0.0, "p95_ms": 3.1, "requests": 1200},
                       "exposure": {"failure_ratio": 0.31, "p95_ms": 48.0, "requests": 700}}
    return doc


def write_evidence(run_dir: Path, name: str, doc: dict) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / f"{name}.series.json").write_text(json.dumps(doc))
    timeline = run_dir / f"{name}.timeline.jsonl"
    timeline.write_text('{"kind": "VirtualService", "resourceVersion": "101"}\n'      # closed as the recorder does
                        '{"kind": "Recorder", "type": "END", "obj": {"complete": true}}\n')
    return timeline


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def reddish_columns(path: Path) -> list[int]:
    """Image columns holding exposure shading (a red tint over white)."""
    from matplotlib.image import imread
    img = imread(str(path))
    r, g, b = img[..., 0], img[..., 1], img[..., 2]
    mask = (r > 0.9) & (g < 0.85) & (b < 0.88) & (r - g > 0.15)
    counts = mask.sum(axis=0)
    return [i for i, c in enumerate(counts) if c > 0.25 * img.shape[0]]


# ----------------------------------------------------------------------------------------------
def test_plot_shades_exposure_window_only_where_it_is(tmp_path):
    with_exp = plot_series(series_doc(), tmp_path / "exp.png")
    without = plot_series(series_doc(title="lane a AFTER rollback (v1.8.2)", exposure=()), tmp_path / "none.png")

    w, h = png_size(with_exp)
    assert 800 <= w <= 2000 and 400 <= h <= 1200
    assert with_exp.stat().st_size > 10_000

    cols = reddish_columns(with_exp)
    assert cols, "no exposure shading drawn"
    # the window is 3.4 s of a ~27 s axis: a band, neither a sliver nor the whole plot
    assert 0.06 * w < len(cols) < 0.2 * w
    # and it lies right of the middle of the picture (t = 6.3 .. 9.7 on -6 .. 20)
    assert w * 0.4 < sum(cols) / len(cols) < w * 0.75
    assert reddish_columns(without) == []


def test_open_exposure_window_runs_to_end_of_recording(tmp_path):
    png = plot_series(series_doc(exposure=((15.0, None),)), tmp_path / "open.png")
    w, _ = png_size(png)
    cols = reddish_columns(png)
    assert cols and max(cols) > 0.93 * w


def test_plot_with_phases_and_load_is_taller_and_written_atomically(tmp_path):
    png = plot_series(series_doc(load=True), tmp_path / "sub" / "load.png")
    w, h = png_size(png)
    assert h > 550 and w >= 1000
    assert [p.name for p in png.parent.iterdir()] == ["load.png"]


# ----------------------------------------------------------------------------------------------
def make_lane_a_run(root: Path, run_id: str, version: str, before_verdict="pass", before_observed=100,
                    load=False, sha=None) -> Path:
    run = root / run_id
    before = write_evidence(run, "lane-a-before", series_doc(title=f"lane a BEFORE rollback ({version})", load=load))
    after = write_evidence(run, "lane-a-after", series_doc(title=f"lane a AFTER rollback ({version})", exposure=()))
    led = Ledger(run, run_id, "embedded", version, controller_sha256=sha)
    led.record("a", "before", "peak canary weight while partial", 100, before_observed, before_verdict,
               evidence=before)
    led.record("a", "before", "exposure seconds", "> 0", 3.4, "pass", evidence=run / "lane-a-before.series.json")
    led.record("a", "after", "peak canary weight while partial", 5, 5, "pass", evidence=after)
    led.record("a", "exit", "Healthy at v1", True, None, "inconclusive",
               reason="no partial-availability window observed")
    return run


def test_run_report_html_and_markdown(tmp_path):
    run = make_lane_a_run(tmp_path, "20251129T170000Z-11", "v1.8.2", load=True)
    html_path, md_path = write_run_report(run)
    assert html_path == run / "report.html" and md_path == run / "report.md"
    page, md = html_path.read_text(), md_path.read_text()

    for text in ("20251129T170000Z-11", "embedded", "v1.8.2", "peak canary weight while partial",
                 "no partial-availability window observed", WEIGHT_NOTE, EMULATION_NOTE):
        assert text in page, text
        assert text in md, text
    # verdicts coloured in HTML
    assert re.search(r'class="verdict v-pass" style="background:#[0-9a-f]{6}">pass<', page)
    assert re.search(r'class="verdict v-inconclusive" style="background:#[0-9a-f]{6}">inconclusive<', page)
    # one picture per distinct series, both embedded, relative, and real PNGs
    imgs = re.findall(r'<img src="([^"]+)"', page)
    assert sorted(imgs) == ["lane-a-after.png", "lane-a-before.png"]
    assert sorted(re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)) == sorted(imgs)
    for name in imgs:
        w, h = png_size(run / name)
        assert w >= 800 and h >= 400
    # the per-phase failure ratios are in the report too
    assert "31.0%" in page and "31.0%" in md
    # evidence links point at the recorded files
    assert 'href="lane-a-before.timeline.jsonl"' in page
    assert "[lane-a-before.timeline.jsonl](lane-a-before.timeline.jsonl)" in md


def test_run_report_without_load_or_series(tmp_path):
    run = tmp_path / "20251129T170000Z-12"
    led = Ledger(run, run.name, "embedded", "v1.10.2")
    led.record("a", "before", "peak canary weight while partial", 100, 100, "pass",
               evidence=run / "missing.timeline.jsonl")
    page, md = (p.read_text() for p in write_run_report(run))
    assert WEIGHT_NOTE in page and WEIGHT_NOTE in md
    assert EMULATION_NOTE not in page and EMULATION_NOTE not in md
    assert "<img" not in page and "![" not in md
    assert list(run.glob("*.png")) == []


def test_plot_is_not_redrawn_when_series_is_unchanged(tmp_path):
    run = make_lane_a_run(tmp_path, "20251129T170000Z-11", "v1.8.2")
    write_run_report(run)
    png = run / "lane-a-before.png"
    first = png.stat().st_mtime_ns
    write_run_report(run)
    assert png.stat().st_mtime_ns == first


# ----------------------------------------------------------------------------------------------
def matrix_line(md: str, row_key: str) -> str:
    lines = [l for l in md.splitlines() if l.startswith(f"| {row_key} |")]
    assert len(lines) == 1, (row_key, lines)
    return lines[0]


def test_matrix_newest_run_wins_and_says_which(tmp_path):
    reports = tmp_path / "reports"
    old = make_lane_a_run(reports, "20251129T170000Z-11", "v1.8.2", before_verdict="fail", before_observed=5)
    new = make_lane_a_run(reports, "20251129T180000Z-12", "v1.8.2")
    other = make_lane_a_run(reports, "20251129T160000Z-10", "v1.10.2")

    html_path, md_path = write_matrix([new, other, old], reports)   # positional order must not matter
    assert (html_path, md_path) == (reports / "matrix.html", reports / "matrix.md")
    md, page = md_path.read_text(), html_path.read_text()

    header = [l for l in md.splitlines() if l.startswith("| lane/step/assertion |")][0]
    assert header.index("v1.8.2") < header.index("v1.10.2")
    line = matrix_line(md, "a/before/peak canary weight while partial")
    v182 = line.split(" | ")[1]
    assert "**pass** 100" in v182 and "run 20251129T180000Z-12" in v182
    assert "20251129T170000Z-11" not in line and "fail" not in line
    assert "[plot](20251129T180000Z-12/lane-a-before.png)" in v182
    assert "run 20251129T160000Z-10" in line.split(" | ")[2]
    # the linked plot exists, from the matrix folder
    for link in re.findall(r'href="([^"]+\.png)"', page):
        assert (reports / link).is_file(), link
    assert "no partial-availability window observed" in matrix_line(md, "a/exit/Healthy at v1")
    assert WEIGHT_NOTE in md and WEIGHT_NOTE in page
    # every run got its own report on the way
    assert all((r / "report.html").is_file() for r in (old, new, other))


def test_matrix_newest_by_recorded_time(tmp_path):
    reports = tmp_path / "reports"
    a = make_lane_a_run(reports, "run-a", "v1.8.2", before_verdict="fail", before_observed=7)
    b = make_lane_a_run(reports, "run-b", "v1.8.2")
    # run-a's rows were recorded later than run-b's: they win although "run-a" < "run-b"
    for run, stamp in ((a, "2025-11-29T19:00:00Z"), (b, "2025-11-29T18:00:00Z")):
        rows = json.loads((run / "ledger.json").read_text())
        for r in rows:
            r["recorded_at"] = stamp
        (run / "ledger.json").write_text(json.dumps(rows))
    md = write_matrix([a, b], reports)[1].read_text()
    line = matrix_line(md, "a/before/peak canary weight while partial")
    assert "**fail** 7" in line and "run run-a" in line and "run-b" not in line


def test_matrix_ignores_what_is_not_a_run_folder(tmp_path):
    reports = tmp_path / "reports"
    run = make_lane_a_run(reports, "20251129T170000Z-11", "v1.8.2")
    empty = reports / "not-a-run"
    empty.mkdir()
    stray = reports / "notes.txt"
    stray.write_text("hello")
    md = write_matrix([run, empty, stray, tmp_path / "nowhere", run], reports)[1].read_text()
    runs_table = md.split("## Runs", 1)[1].split("## Controller", 1)[0]
    assert runs_table.count("20251129T170000Z-11 |") == 1
    assert "not-a-run" not in md and "notes.txt" not in md and "nowhere" not in md
    assert not (empty / "report.html").exists()


def test_matrix_discovers_run_folders_and_counts_latest_once(tmp_path):
    reports = tmp_path / "reports"
    make_lane_a_run(reports, "20251129T170000Z-11", "v1.8.2")
    make_lane_a_run(reports, "20251129T180000Z-12", "v1.10.2")
    (reports / "latest").symlink_to("20251129T180000Z-12")
    (reports / "scratch").mkdir()
    md = write_matrix(None, reports)[1].read_text()
    runs_table = md.split("## Runs", 1)[1].split("## Controller", 1)[0]
    assert runs_table.count("| 20251129T170000Z-11 |") == 1
    assert runs_table.count("| 20251129T180000Z-12 |") == 1
    assert "latest/" not in md and "scratch" not in md


def test_matrix_with_no_runs(tmp_path):
    html_path, md_path = write_matrix(None, tmp_path / "reports")
    assert "No run folders found." in md_path.read_text()
    assert "No run folders found." in html_path.read_text()


def test_user_built_controller_has_its_own_column(tmp_path):
    reports = tmp_path / "reports"
    make_lane_a_run(reports, "r1", "v1.8.2")
    make_lane_a_run(reports, "r2", "v1.8.2", sha="ab" * 32, before_verdict="fail", before_observed=100)
    md = write_matrix(None, reports)[1].read_text()
    header = [l for l in md.splitlines() if l.startswith("| lane/step/assertion |")][0]
    assert "| v1.8.2 |" in header and "v1.8.2 (sha256 abababababab)" in header
    line = matrix_line(md, "a/before/peak canary weight while partial")
    assert "**pass** 100" in line and "**fail** 100" in line


# ----------------------------------------------------------------------------------------------
def make_order_run(root: Path, run_id: str, version: str, hazard: tuple) -> Path:
    run = root / run_id
    end = write_evidence(run, "order-end-of-steps", series_doc(title=f"end-of-steps ({version})", exposure=()))
    mid = write_evidence(run, "order-mid-steps", series_doc(title=f"mid-steps ({version})", exposure=()))
    led = Ledger(run, run_id, "embedded", version)
    led.record("order", "end-of-steps", "branch order: backward search (:245) before end-of-steps (:261)",
               50, 50, "pass", evidence=end)
    led.record("order", "mid-steps", "branch order: backward search (:245) before mid-steps (:255)",
               25, 25, "pass", evidence=mid)
    expected, observed, verdict, reason = hazard
    evidence = None
    if verdict != "not_applicable":
        evidence = write_evidence(run, "order-hazard", series_doc(title=f"hazard ({version})"))
    led.record("order", "hazard-replica-progress-threshold", "weight at last rung with replicaProgressThreshold",
               expected, observed, verdict, evidence=evidence, reason=reason)
    return run


def test_branch_order_section_calls_out_hazard(tmp_path):
    reports = tmp_path / "reports"
    make_order_run(reports, "r1", "v1.8.2", (5, None, "not_applicable", "field absent from the CRD schema"))
    make_order_run(reports, "r2", "v1.10.2", (5, 100, "fail", None))
    make_order_run(reports, "r3", "v1.9.3", (5, 5, "pass", None))
    html_path, md_path = write_matrix(None, reports)
    md, page = md_path.read_text(), html_path.read_text()
    section = md.split("## Branch order", 1)[1]

    assert "| controller version | before end-of-steps | before mid-steps | hazards |" in section
    row = [l for l in section.splitlines() if l.startswith("| **v1.10.2")][0]
    cells = row.split(" | ")
    assert "[plot](r2/order-end-of-steps.png)" in cells[1]
    assert "[plot](r2/order-mid-steps.png)" in cells[2]
    assert "**fail** 100" in cells[3] and "[plot](r2/order-hazard.png)" in cells[3]
    bold = re.findall(r"^\*\*(v[^*]+)\*\*$", section, flags=re.M)
    assert len(bold) == 1 and bold[0].startswith("v1.10.2: the prescription no longer keeps the weight")
    assert re.search(r"<strong>v1\.10\.2: the prescription no longer keeps the weight", page)
    v182 = [l for l in section.splitlines() if l.startswith("| v1.8.2 |")][0]
    assert "not applicable" in v182 and "field absent from the CRD schema" in v182
    assert "| v1.9.3 |" in section and "v1.9.3:" not in section
    order = [l.split(" | ")[0] for l in section.splitlines() if l.startswith("| v") or l.startswith("| **v")]
    assert order == ["| v1.8.2", "| v1.9.3", "| **v1.10.2 ⚠**"]


# ----------------------------------------------------------------------------------------------
def parser():
    return build_parser()


def test_drills_report_default_and_explicit(tmp_path, monkeypatch, capsys):
    reports = tmp_path / "reports"
    run = make_lane_a_run(reports, "20251129T170000Z-11", "v1.8.2")
    monkeypatch.setenv("DRILLS_REPORTS", str(reports))

    args = parser().parse_args(["report"])
    # the run's exit row is inconclusive: the report's gate is 3, as the run's was
    assert args.func.name == cmd_report.__name__ and args.func(args) == 3      # drills report's body, run
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("prescription holds on v1.8.2: "), out       # the answer first, then the rows
    assert out[-2:] == [f"matrix: {reports / 'matrix.html'}", f"        {reports / 'matrix.md'}"], out
    assert "20251129T170000Z-11" in (reports / "matrix.md").read_text()

    # a path given that is no run folder (here a file) is bad input, never ignored: nothing is written
    (reports / "matrix.md").unlink()
    args = parser().parse_args(["report", str(run), str(reports / "matrix.html")])
    with pytest.raises(BadInput, match="not a run folder"):
        args.func(args)
    assert not (reports / "matrix.md").exists()


def test_drills_report_missing_run_dir_is_bad_input(tmp_path, monkeypatch):
    monkeypatch.setenv("DRILLS_REPORTS", str(tmp_path / "reports"))
    args = parser().parse_args(["report", str(tmp_path / "no-such-run")])
    with pytest.raises(BadInput, match="no-such-run"):
        args.func(args)
    assert not (tmp_path / "reports" / "matrix.md").exists()


def test_unreadable_series_gives_no_picture_but_a_report(tmp_path):
    run = tmp_path / "r1"
    timeline = write_evidence(run, "broken", series_doc())
    (run / "broken.series.json").write_text('{"title": "cut off')
    Ledger(run, "r1", "embedded", "v1.8.2").record("a", "before", "peak canary weight while partial", 100, 100,
                                                    "pass", evidence=timeline)
    page = write_run_report(run)[0].read_text()
    assert "peak canary weight while partial" in page and "<img" not in page
    assert 'href="broken.timeline.jsonl"' in page
