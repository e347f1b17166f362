"""`opt4torch simulate`, run as a user would run it: traces, pattern sweeps,
tables, plots and errors."""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
import re
import subprocess

import numpy as np
import pytest
from conftest import TEXTBOOK, script

import opt4torch
from opt4torch.lab import traces
from opt4torch.cli import main


def run(*args: str, cwd: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([script("opt4torch"), *args], capture_output=True, text=True, timeout=600, cwd=cwd,
                          env=env)


def test_trace_csv_contract(tmp_path) -> None:
    trace = tmp_path / "t.txt"
    trace.write_text("\n".join(map(str, TEXTBOOK)) + "\n")
    r = run("simulate", "--trace", str(trace), "--policy", "lru,opt", "--capacity", "100,500", "--format", "csv")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert r.stdout.splitlines()[0] == "policy,capacity,accesses,hits,misses,hit_rate"
    assert [(row["policy"], row["capacity"]) for row in rows] == [("lru", "100"), ("lru", "500"), ("opt", "100"),
                                                                   ("opt", "500")]
    assert all(int(row["hits"]) == 20 - 6 for row in rows)  # 6 distinct ids: only compulsory misses


def test_trace_json_rows_equal_the_api(tmp_path, capsys) -> None:
    seq = traces.zipf(400, 5_000, alpha=0.8, seed=1)
    np.save(tmp_path / "t.npy", seq)
    assert main(["simulate", "--trace", str(tmp_path / "t.npy"), "--policy", "all", "--capacity", "5%,25%",
                 "--items", "400", "--seed", "9", "--format", "json", "--quiet"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2 * len(opt4torch.POLICIES)
    assert set(rows[0]) == {"policy", "capacity", "accesses", "hits", "misses", "hit_rate"}
    for row in rows:
        assert row["capacity"] in (20, 100)
        assert row["hits"] == opt4torch.simulate(row["policy"], seq, row["capacity"], items=400, seed=9)["hits"]


def test_pattern_sweep_writes_tables_and_plots(tmp_path) -> None:
    out = tmp_path / "out"
    r = run("simulate", "--pattern", "zipf", "--param", "alpha=0.6,1.2", "--items", "2000", "--epochs", "3",
            "--policy", "opt,lru,lfu,freq", "--capacity", "1%,10%,50%", "--seed", "4", "--out", str(out),
            "--format", "csv")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "policy,capacity,accesses,hits,misses,hit_rate,pattern,param,value,items,seed"
    assert sorted(os.listdir(out)) == ["gain_zipf.png", "hit_rate_zipf.png", "results.csv", "results.json"]
    for png in ("gain_zipf.png", "hit_rate_zipf.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    rows = json.loads((out / "results.json").read_text())
    assert len(rows) == 2 * 4 * 3
    with open(out / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    for alpha in (0.6, 1.2):
        seq = traces.zipf(2000, 6000, alpha=alpha, seed=4)
        mine = [row for row in rows if row["value"] == alpha]
        assert {(row["pattern"], row["param"], row["items"], row["seed"]) for row in mine} == {("zipf", "alpha", 2000, 4)}
        for row in mine:
            want = opt4torch.simulate(row["policy"], seq, row["capacity"], items=2000, seed=4)
            assert (row["accesses"], row["hits"]) == (6000, want["hits"])


def test_all_patterns_table(tmp_path) -> None:
    r = run("simulate", "--pattern", "all", "--items", "500", "--epochs", "2", "--capacity", "10%",
            "--policy", "opt,lru", "--out", str(tmp_path / "o"), "--no-plots")
    assert r.returncode == 0, r.stderr
    for name in traces.GENERATORS:
        assert name in r.stdout
    assert sorted(os.listdir(tmp_path / "o")) == ["results.csv", "results.json"]
    rows = json.loads((tmp_path / "o" / "results.json").read_text())
    assert {row["pattern"] for row in rows} == set(traces.GENERATORS)


def test_missing_matplotlib_is_explained(tmp_path) -> None:
    """A matplotlib that cannot be imported (a stub package first on the
    path) gives the install command, before any simulation runs."""
    stub = tmp_path / "stub" / "matplotlib"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "stub")}
    r = run("simulate", "--pattern", "uniform", "--items", "100", "--out", str(tmp_path / "o"), env=env)
    assert r.returncode != 0
    assert "pip install 'opt4torchdataset[plot]'" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()
    r = run("simulate", "--pattern", "uniform", "--items", "100", "--out", str(tmp_path / "o"), "--no-plots",
            env=env)
    assert r.returncode == 0, r.stderr


def test_help_lists_policies_and_patterns() -> None:
    r = run("simulate", "--help")
    assert r.returncode == 0
    for name in (*opt4torch.POLICIES, *traces.GENERATORS, "--pattern", "--param", "--out", "alpha=1.0"):
        assert name in r.stdout, name


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["simulate", "--capacity", "3"], "give either --trace PATH or --pattern"),
        (["simulate", "--pattern", "nope"], "unknown pattern nope"),
        (["simulate", "--pattern", "zipf", "--param", "alpha"], "expected NAME=V1,V2"),
        (["simulate", "--pattern", "uniform", "--param", "alpha=1"], "none of the patterns uniform has it"),
        (["simulate", "--pattern", "zipf", "--param", "alpha=high"], "not a valid float"),
        (["simulate", "--pattern", "zipf", "--param", "alpha=-1", "--items", "10"], "alpha must be"),
        (["simulate", "--pattern", "uniform", "--policy", "belady"], "unknown policy belady"),
        (["simulate", "--pattern", "uniform", "--capacity", "0"], "at least one item"),
        (["simulate", "--pattern", "uniform", "--epochs", "0"], "--epochs must be at least 1"),
        (["simulate", "--pattern", "uniform", "--workers", "0"], "--workers must be at least 1"),
    ],
)
def test_errors_are_clear(tmp_path, args: list[str], message: str) -> None:
    r = run(*args, cwd=str(tmp_path))
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_trace_rejects_pattern_flags(tmp_path) -> None:
    trace = tmp_path / "t.txt"
    trace.write_text("0\n1\n")
    r = run("simulate", "--trace", str(trace), "--param", "alpha=1")
    assert r.returncode == 2 and "do not apply to --trace" in r.stderr


# ---- the table, its summary and the plots, as a reader sees them ----


def _table_and_summary(stdout: str) -> tuple[list[str], list[str]]:
    """The full table's lines and the summary's table lines (title dropped)."""
    table, _, summary = stdout.partition("\n\nSummary: ")
    return table.splitlines(), summary.splitlines()[1:]


def test_table_columns_are_separated_and_sized_by_their_content(capsys) -> None:
    """Every column of the full table is two spaces or more from the next
    (the run-together 'parampolicy' and 'alpha=1.0freq' of a sweep with
    --policy all), and each column is as wide as its widest cell."""
    assert main(["simulate", "--pattern", "zipf", "--param", "alpha=0.6,1.0", "--items", "1000", "--epochs", "2",
                 "--policy", "all", "--capacity", "1%,10%", "--quiet"]) == 0
    table, _ = _table_and_summary(capsys.readouterr().out)
    head = ["pattern", "param", "policy", "capacity", "of items", "hits", "misses", "hit rate"]
    assert re.split(r" {2,}", table[0].strip()) == head
    assert len(table) == 1 + 2 * len(opt4torch.POLICIES) * 2
    for line in table[1:]:
        cells = re.split(r" {2,}", line.strip())
        assert len(cells) == len(head), line
        assert cells[0] == "zipf" and cells[1] in ("alpha=0.6", "alpha=1.0") and cells[2] in opt4torch.POLICIES
        assert cells[4] in ("1%", "10%") and cells[7].endswith("%")
    # Right-aligned numbers end in one column; the longest policy name
    # ("opt-nobypass") still leaves two spaces before the capacity.
    ends = {line.index(re.split(r" {2,}", line.strip())[3]) + len(re.split(r" {2,}", line.strip())[3])
            for line in table}
    assert len(ends) == 1
    assert "parampolicy" not in table[0] and not any("opt-nobypass " + "1" in line for line in table)


def test_summary_names_the_best_online_policy_and_opts_gains(capsys) -> None:
    """The summary after the table: per trace and capacity, OPT's hit rate,
    the best online policy and its hit rate, LRU's, and OPT's gains in
    points, each equal to what the simulator gives for that trace."""
    items, capacities = 1000, {"1%": 10, "10%": 100}
    assert main(["simulate", "--pattern", "zipf", "--param", "alpha=0.6,1.2", "--items", str(items), "--epochs",
                 "3", "--policy", "all", "--capacity", ",".join(capacities), "--seed", "2", "--quiet"]) == 0
    _, summary = _table_and_summary(capsys.readouterr().out)
    assert re.split(r" {2,}", summary[0].strip()) == ["trace", "capacity", "opt", "best online", "its hit rate",
                                                      "lru", "opt - lru", "opt - best online"]
    assert len(summary) == 1 + 2 * len(capacities)
    online = [p for p in opt4torch.POLICIES if p not in ("opt", "opt-nobypass", "freq")]
    trace = ""
    for line in summary[1:]:
        cells = re.split(r" {2,}", line.strip())
        if len(cells) == 8:
            trace = cells.pop(0)
        alpha = float(trace.split("=")[1])
        seq = traces.zipf(items, 3 * items, alpha=alpha, seed=2)
        asked = cells[0].split("(")[1].rstrip(")")
        c = capacities[asked]
        assert cells[0] == f"{c:,} ({asked})"
        rate = {p: opt4torch.simulate(p, seq, c, items=items, seed=2)["hits"] / seq.size for p in opt4torch.POLICIES}
        best = max(sorted(online), key=lambda p: rate[p])
        assert cells[1] == f"{rate['opt']:.1%}"
        assert cells[2] == best and cells[3] == f"{rate[best]:.1%}"
        assert cells[4] == f"{rate['lru']:.1%}"
        assert cells[5] == f"{100 * (rate['opt'] - rate['lru']):+.1f}"
        assert cells[6] == f"{100 * (rate['opt'] - rate[best]):+.1f}"
        assert float(cells[6]) >= 0  # no online policy beats OPT


def test_summary_left_out_when_nothing_compares(tmp_path, capsys) -> None:
    trace = tmp_path / "t.txt"
    trace.write_text("\n".join(map(str, TEXTBOOK)) + "\n")
    assert main(["simulate", "--trace", str(trace), "--policy", "lru", "--capacity", "3", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "Summary" not in out and re.split(r" {2,}", out.splitlines()[1].strip())[:2] == ["lru", "3"]
    # A trace with OPT and LRU only: OPT's gain over LRU, LRU the best online.
    assert main(["simulate", "--trace", str(trace), "--policy", "lru,opt", "--capacity", "3", "--quiet"]) == 0
    _, summary = _table_and_summary(capsys.readouterr().out)
    assert [re.split(r" {2,}", line.strip()) for line in summary] == [
        ["trace", "capacity", "opt", "best online", "its hit rate", "lru", "opt - lru", "opt - best online"],
        ["t.txt", "3 (37.5%)", "60.0%", "lru", "40.0%", "40.0%", "+20.0", "+20.0"]]


def test_output_cut_short_by_the_reader_is_no_error(tmp_path) -> None:
    """`opt4torch simulate ... | head`: the command stops quietly."""
    p = subprocess.Popen([script("opt4torch"), "simulate", "--pattern", "all", "--items", "300", "--epochs", "1",
                          "--policy", "all", "--capacity", "1%,2%,5%,10%,20%,50%", "--format", "json", "--quiet"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    assert p.stdout.readline().strip() == b"["
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err


def _sweep_rows(tmp_path, *args: str) -> list[dict]:
    out = tmp_path / "o"
    assert main(["simulate", *args, "--out", str(out), "--quiet", "--format", "json"]) == 0
    return json.loads((out / "results.json").read_text())


def _label_boxes(fig, ax) -> list:
    """The window extents of the visible, non-empty x tick labels, as drawn."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return sorted((t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_text() and t.get_visible()),
                  key=lambda b: b.x0)


def test_trace_plot_labels_capacities_as_asked_and_fits_the_data(tmp_path, capsys) -> None:
    """The trace plot of issue 34: 1 % of 1,020 items is 10 items (0.98 %)
    and 5 % is 51; the ticks say 1 % and 5 %, do not overlap, the y axis
    spans the data (not 0-100 %), and every policy has a look of its own."""
    pytest.importorskip("matplotlib")
    from opt4torch.lab import plots

    seq = traces.zipf(1020, 40_000, alpha=1.3, seed=0)
    assert seq.max() == 1019
    np.save(tmp_path / "z.npy", seq)
    rows = _sweep_rows(tmp_path, "--trace", str(tmp_path / "z.npy"), "--policy", "all",
                       "--capacity", "1%,2%,5%,10%")
    capsys.readouterr()
    assert {r["requested"] for r in rows} == {"1%", "2%", "5%", "10%"}
    assert sorted({r["capacity"] for r in rows}) == [10, 20, 51, 102]
    assert (tmp_path / "o" / "hit_rate_z.npy.png").read_bytes()[:4] == b"\x89PNG"
    fig = plots.hit_rate_figure(rows)
    try:
        ax = fig.axes[0]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1%", "2%", "5%", "10%"]
        assert list(ax.get_xticks()) == pytest.approx([10 / 1020, 20 / 1020, 51 / 1020, 102 / 1020])
        boxes = _label_boxes(fig, ax)
        assert len(boxes) == 4
        assert all(a.x1 < b.x0 for a, b in itertools.pairwise(boxes))
        rates = [r["hit_rate"] for r in rows]
        lo, hi = ax.get_ylim()
        assert lo <= min(rates) and max(rates) <= hi  # every point shows
        assert lo > 0.2 and hi < 1.0  # the data's range, not 0-100 %
        assert hi - lo < 1.3 * (max(rates) - min(rates))
        looks = {(line.get_color(), line.get_marker(), line.get_linestyle()) for line in ax.get_lines()}
        assert len(ax.get_lines()) == len(opt4torch.POLICIES) == len(looks)
        legend = [t.get_text() for t in fig.legends[0].get_texts()]
        assert legend[0] == "opt" and sorted(legend) == sorted(opt4torch.POLICIES)
    finally:
        fig.clf()


def test_crowded_capacity_ticks_never_overlap(tmp_path, capsys) -> None:
    """Capacities too close to label each: some labels are left out, the
    ones shown never overlap, and each sits at its own capacity."""
    pytest.importorskip("matplotlib")
    from opt4torch.lab import plots

    rows = _sweep_rows(tmp_path, "--pattern", "zipf", "--items", "2000", "--epochs", "2", "--policy", "opt,lru",
                       "--capacity", "1%,1.1%,1.2%,1.3%,1.4%,2%,5%,10%")
    capsys.readouterr()
    fig = plots.hit_rate_figure(rows)
    try:
        ax = fig.axes[0]
        labels = [t.get_text() for t in ax.get_xticklabels()]
        assert labels[0] == "1%" and labels[-3:] == ["2%", "5%", "10%"]
        assert "" in labels and set(labels) - {""} <= {"1%", "1.1%", "1.2%", "1.3%", "1.4%", "2%", "5%", "10%"}
        boxes = _label_boxes(fig, ax)
        assert all(a.x1 < b.x0 for a, b in itertools.pairwise(boxes))
    finally:
        fig.clf()


def test_sweep_panels_each_fit_their_data_and_the_heatmap_says_what_was_asked(tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    from opt4torch.lab import plots

    rows = _sweep_rows(tmp_path, "--pattern", "zipf", "--param", "alpha=0.6,1.2", "--items", "1020",
                       "--epochs", "3", "--policy", "opt,lru,fifo,arc", "--capacity", "1%,5%,20%")
    capsys.readouterr()
    fig = plots.hit_rate_figure(rows)
    try:
        panels = [ax for ax in fig.axes if ax.get_visible()]
        assert [ax.get_title() for ax in panels] == ["alpha = 0.6", "alpha = 1.2"]
        for ax, alpha in zip(panels, (0.6, 1.2)):
            rates = [r["hit_rate"] for r in rows if r["value"] == alpha]
            lo, hi = ax.get_ylim()
            assert lo <= min(rates) and max(rates) <= hi and hi - lo < 1.3 * (max(rates) - min(rates)) + 0.03
            assert [t.get_text() for t in ax.get_xticklabels()] == ["1%", "5%", "20%"]
        assert panels[0].get_ylim() != panels[1].get_ylim()
    finally:
        fig.clf()
    fig = plots.gain_figure(rows)
    try:
        ax = fig.axes[0]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1%", "5%", "20%"]
        cells = [t.get_text() for t in ax.texts]
        assert len(cells) == 2 * 3 and all(c.split("\n")[1] in ("lru", "fifo", "arc") for c in cells)
        assert all(float(c.split("\n")[0]) >= 0 for c in cells)
    finally:
        fig.clf()
