"""The benchmark tools that need no GPU: the sweep figures that README and NOTES quote
(benchmarks/paper/plot_seed_sweep.dips on made-up curves whose dips are known), bench_sustained's nvidia-smi
reader, the output rotation of the interleaved timings, the paper table, README's figures from the committed
corrected_matmul runs, the short sums' error measurement, and the CUDA microbenchmarks' builds."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from conftest import NO_IMPLICIT_HALF, NVCC, REPO_ROOT, child_process_env

sys.path.insert(0, str(REPO_ROOT / "benchmarks" / "paper"))

from plot_seed_sweep import SWEEP, dips, summary, sweep_range, sweep_rows  # noqa: E402


def rows_of(rates):
    return [{"n": 64 * (i + 1), "tflops": r} for i, r in enumerate(rates)]


def test_sweep_of_a_stopped_run_is_refused_and_its_range_read_from_the_rows():
    """The tables read the sweep's range from its rows (a --quick run steps N by 1024, not 64), and refuse a run
    that bench_corrected_matmul.py saved before its end ("complete": false), whose sweep stops early."""
    rows = [dict(SWEEP, n=n, blocks=1) for n in (2112, 64, 1088)]
    assert [r["n"] for r in sweep_rows({"complete": True, "rows": rows})] == [64, 1088, 2112]
    assert sweep_range(sweep_rows({"complete": True, "rows": rows})) == "64 .. 2112 step 1024"
    assert sweep_range(sweep_rows({"rows": rows + [dict(SWEEP, n=128, blocks=1)]})) == "64 .. 2112"
    with pytest.raises(SystemExit, match="unfinished run"):
        sweep_rows({"complete": False, "rows": rows})


def test_steep_rise_is_below_nearby_but_no_dip():
    # The time per call nearly flat: the rate rises with N, by more than 10% over five steps.
    found = dips(rows_of([1.0 * (i + 1) for i in range(20)]))
    assert found["valleys"] == [] and found["drops"] == []
    # Point i (rate i + 1) is more than 10% below a point within five steps while 0.9 * (i + 6) > i + 1, and the
    # last one (rate 20) bounds those near the end: points 0 .. 16.
    assert found["nearby"] == [64 * (i + 1) for i in range(17)]


def test_sawtooth_drops():
    # Wave quantization: the rate climbs, then falls by 30% where a new wave starts.
    rates = [10.0, 10.2, 10.4, 10.6, 7.0, 7.4, 7.8, 8.2, 8.6, 9.0, 9.4, 9.8, 10.2, 10.6, 11.0, 11.0]
    found = dips(rows_of(rates))
    fallen = [64 * 5, 64 * 6, 64 * 7, 64 * 8, 64 * 9]  # 7.0 .. 8.6: more than 10% below the 10.6 before them
    assert found["drops"] == fallen
    assert found["valleys"] == fallen  # and below the climb after them too
    # nearby: those, and the climb's 9.0, 9.4, 9.8, more than 10% below the 11.0 within five steps after them
    assert found["nearby"] == fallen + [64 * 10, 64 * 11, 64 * 12]


def test_valley_and_step():
    flat = [10.0] * 12
    valley = flat[:6] + [8.5] + flat[7:]
    assert dips(rows_of(valley)) == {"nearby": [64 * 7], "valleys": [64 * 7], "drops": [64 * 7]}
    # A step up (as at N = 32768, where K is summed in one chunk): below the next points, but not a dip.
    step = [10.0] * 6 + [11.5] * 6
    found = dips(rows_of(step))
    assert found["valleys"] == [] and found["drops"] == []
    assert found["nearby"] == [64 * (i + 1) for i in range(1, 6)]  # the five points before the step
    # Exactly 10% below is not more than 10% below.
    assert dips(rows_of(flat[:6] + [9.0] + flat[7:]))["nearby"] == []


def test_sustained_reads_nvidia_smi_samples(tmp_path):
    # bench_sustained.smi_samples: nvidia-smi's CSV lines (timestamp, SM clock, power, throttle reasons) to
    # numbers; lines it cannot read (a header, a driver message) are skipped.
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    from bench_sustained import POWER_CAP_REASON, smi_samples

    csv = tmp_path / "smi.csv"
    csv.write_text("timestamp, clocks.current.sm [MHz], power.draw [W], clocks_throttle_reasons.active\n"
                   "2026/11/22 13:01:02.250, 1770 MHz, 692.40 W, 0x0000000000000004\n"
                   "some driver message\n"
                   "2026/11/22 13:01:02.300, 1980 MHz, 120.05 W, 0x0000000000000000\n")
    samples = smi_samples(str(csv))
    assert [s[1:] for s in samples] == [(1770.0, 692.40, 0x4), (1980.0, 120.05, 0)]
    assert abs((samples[1][0] - samples[0][0]) - 0.05) < 1e-6
    assert samples[0][3] & POWER_CAP_REASON and not samples[1][3] & POWER_CAP_REASON


def test_holding_results_keeps_a_rotation_of_outputs_alive():
    # common.holding_results: the last inputs_for_rotation(bytes, L2) results stay alive, so that each call's output
    # is another block than those of its recent predecessors; older ones are released (no growth).
    import weakref

    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    from common import holding_results, inputs_for_rotation

    class Output:  # a weakref-able stand-in for a tensor the timed function allocates
        pass

    made = []

    def allocate():
        made.append(Output())
        return made[-1]

    mib = 1 << 20
    held = inputs_for_rotation(32 * mib, 50 * mib)
    assert held == 5  # one rotation of 6 outputs of 32 MiB: more than 3x a 50 MiB L2
    call = holding_results(allocate, 32 * mib, 50 * mib)
    for _ in range(25):
        call()
    alive = [weakref.ref(o) for o in made]
    made.clear()
    assert [r() is not None for r in alive] == [False] * 20 + [True] * 5
    assert inputs_for_rotation(4096 * mib, 50 * mib) == 1  # a large output: the previous one only


def test_paper_table_is_up_to_date(tmp_path):
    """benchmarks/results/paper_table.md is what make_table.py makes of the committed result files (it quotes
    corrected_matmul.json's sweep, which each benchmark run replaces: regenerate the table after one)."""
    root = REPO_ROOT
    out = tmp_path / "paper_table.md"
    subprocess.run([sys.executable, root / "benchmarks" / "paper" / "make_table.py", "--out", out],
                   check=True, capture_output=True)
    committed = root / "benchmarks" / "results" / "paper_table.md"
    assert out.read_text() == committed.read_text(), "run benchmarks/paper/make_table.py"


def test_short_sums_measures_errors_in_units_of_u(tmp_path):
    """benchmarks/accuracy_short_sums.py (README quotes it): one call per shape on the CPU (and CUDA with a GPU).
    Its measure is checked on what IEEE rounding fixes: float32's error on a single product (K = 1) is at most
    one rounding, u / (1 + u) relative, and above half of that for some of 262144 random products."""
    subprocess.run([sys.executable, REPO_ROOT / "benchmarks" / "accuracy_short_sums.py", "--outputs", "1",
                    "--seed", "7", "--out", tmp_path], check=True, capture_output=True, env=child_process_env())
    payload = json.loads((tmp_path / "short_sums.json").read_text())
    assert {"gpu", "torch", "date", "rows"} <= payload.keys()
    assert "max_u_ours_cpu" in (tmp_path / "short_sums.md").read_text()
    rows = {(r["m"], r["k"]): r for r in payload["rows"]}
    assert set(rows) == {(1, 1), (1, 8), (1, 32), (256, 32), (256, 256)}
    assert 0.5 < rows[1, 1]["max_u_fp32_cpu"] <= 1.0
    # The split's error over one product is a few u: above float32's, and bounded; over 256 terms it is below
    # the sum's rounding, which float32's GEMM has as well. (On the CPU, and with a GPU on CUDA too.)
    for device in ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",):
        assert rows[1, 1][f"max_u_fp32_{device}"] < rows[1, 1][f"max_u_ours_{device}"] < 16
        assert rows[256, 256][f"max_u_ours_{device}"] < rows[256, 256][f"max_u_fp32_{device}"]


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("source", sorted(p.name for p in (REPO_ROOT / "benchmarks" / "micro").glob("*.cu")))
def test_micro_benchmarks_compile(tmp_path, source):
    """The standalone CUDA microbenchmarks still build, warnings as errors, with PyTorch's flags against
    implicit half conversions (products_floor.cu uses the device library's splits, so a change there must
    keep it building); they run only on an H100/H200 by hand."""
    result = subprocess.run([NVCC, "-O3", "-std=c++17", "-gencode", "arch=compute_90a,code=sm_90a", *NO_IMPLICIT_HALF,
                             "-Werror", "all-warnings", "-o", tmp_path / "micro",
                             REPO_ROOT / "benchmarks" / "micro" / source, "-ldl"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# README's square tables: (the results file each quotes, the JSON file it was made from).
README_SQUARE_TABLES = [
    ("benchmarks/results/corrected_matmul.md", "benchmarks/results/corrected_matmul.json"),
    ("benchmarks/results/h100/corrected_matmul.md", "benchmarks/results/h100/corrected_matmul.json"),
]
README_SWEEP_ROW = "| sweep M = 128, K = 4096, N >= 1024: never slower |"


def _error(x):
    """An error as README writes it: 1.1e-7."""
    return f"{x:.1e}".replace("e-0", "e-")


def _auto_row(rows, batch, size, dist):
    (row,) = [r for r in rows if r["method"] == "auto" and r["batch"] == batch and r["dist"] == dist
              and r["m"] == r["n"] == r["k"] == size]
    return row


def _cells(line):
    """A markdown table row's cells, stripped."""
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _table_after(text, marker):
    """The cells of the first markdown table after `marker`, less its header and separator rows."""
    lines = text[text.index(marker):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        table.append(_cells(line))
    return table


@pytest.mark.parametrize("md,json_path", README_SQUARE_TABLES, ids=["h200", "h100"])
def test_readme_square_tables_quote_the_committed_results(md, json_path):
    """README's tables of square and batched products, `auto`, quote the committed benchmark run they link to, cell
    by cell as rounded there: a rerun that changes the JSON without the README (or the reverse) fails here."""
    readme = (REPO_ROOT / "README.md").read_text()
    rows = json.loads((REPO_ROOT / json_path).read_text())["rows"]
    table = _table_after(readme, f"]({md})")
    assert [r[0] for r in table] == ["1024", "2048", "4096", "8192", "16384", "64 x 512^3"]
    for cells in table:
        batch, size = (64, 512) if cells[0] == "64 x 512^3" else (1, int(cells[0]))
        uniform = _auto_row(rows, batch, size, "uniform")
        expected = [f"{uniform['tflops']:.1f}", f"{uniform['fp32_tflops']:.1f}", f"{uniform['speedup_vs_fp32']:.2f}x",
                    f"{uniform['call_speedup_vs_fp32']:.2f}x",
                    _error(uniform["rel_err"]), _error(uniform["fp32_rel_err"])]
        if batch == 1:
            normal = _auto_row(rows, batch, size, "normal")
            expected += [f"{normal['tflops']:.1f}", f"{normal['speedup_vs_fp32']:.2f}x"]
        else:
            expected += ["", ""]
        assert cells[1:] == expected, cells[0]


def test_readme_targets_table_quotes_the_sweeps():
    """The targets table's row on the sweep M = 128, K = 4096 (never slower from N = 1024): each GPU's count of points,
    its lowest speed-up and where, and its median, from the committed runs (its columns in README_SQUARE_TABLES's
    order: H200, H100)."""
    readme = (REPO_ROOT / "README.md").read_text()
    (row,) = [line for line in readme.splitlines() if line.startswith(README_SWEEP_ROW)]
    for cell, (_, json_path) in zip(_cells(row)[1:], README_SQUARE_TABLES, strict=True):
        rows = sweep_rows(json.loads((REPO_ROOT / json_path).read_text()))
        figures = summary(rows, min_n=1024)
        lowest, median, _ = figures["ratio"]
        lowest_n = min((r for r in rows if r["n"] >= 1024), key=lambda r: r["speedup_vs_fp32"])["n"]
        assert figures["faster_share"] == 1, json_path
        assert cell.startswith(f"all {figures['n_big']} points; lowest {lowest:.2f}x (N = {lowest_n}), "
                               f"median {median:.2f}x"), (cell, json_path)
