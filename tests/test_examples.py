"""The examples users copy: README's Python code blocks and examples/train_mlp.py, run as written; and the
tests and files README points to exist."""
from __future__ import annotations

import json
import re
import runpy
import subprocess
import sys

import pytest
import torch

from conftest import DEVICES, REPO_ROOT, child_process_env, random_tensor


def _readme_python_blocks() -> list[str]:
    readme = (REPO_ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", readme, re.DOTALL)


# An assignment whose comment starts with the result's shape: `name = ...  # (2, 3, 64, 16) ...`.
_SHAPE_COMMENT = re.compile(r"^(\w+) = .*#\s*(\(\d+(?:, *\d+)*\))")


def _with_shape_checks(code: str) -> tuple[str, int]:
    """`code` with an assert after each assignment whose comment gives the result's shape, and their count."""
    lines, checks = [], 0
    for line in code.splitlines():
        lines.append(line)
        if found := _SHAPE_COMMENT.match(line):
            lines.append(f"assert tuple({found[1]}.shape) == {found[2]}, ({found[1]!r}, tuple({found[1]}.shape))")
            checks += 1
    return "\n".join(lines), checks


@pytest.mark.parametrize("device", DEVICES)
def test_readme_examples_run(device, gen, tmp_path):
    """README's Python examples, run as written (on the CPU with "cuda" read as "cpu", less the line that measures
    the GPU's fragment layout), and what their comments say of the results: each shape a comment gives, right
    after its line (c is assigned again later), and the rest below."""
    code = "\n".join(_readme_python_blocks())
    if device == "cpu":
        code = "\n".join(line for line in code.splitlines() if not ("fragment_map(" in line and "device=" in line))
        code = code.replace('"cuda"', '"cpu"')
    code, shape_checks = _with_shape_checks(code)
    assert shape_checks >= 3  # c's broadcast product, p, per_sample
    script = tmp_path / "readme_examples.py"  # (a file of their own: torch.compile reads the source of f)
    script.write_text(code)
    scope = runpy.run_path(str(script))
    assert scope["c"].dtype == torch.float32 and scope["c"].device.type == device  # the autocast line's result
    assert scope["p"].shape == (10000, 32, 32) and scope["p"].dtype == torch.float32
    assert scope["p16"].dtype == torch.bfloat16
    assert scope["per_sample"].shape == (8, 4096, 512)
    assert scope["t"].shape == (32, 16, 2) and scope["t"].dtype == torch.int32  # Volta's A: 16 elements a lane
    a, b, u = (random_tensor(gen, shape, "normal", device) for shape in [(3, 4), (4, 5), (2, 3)])
    first, second = scope["f"](a, b, u)  # the torch.compile example
    assert first.shape == (3, 5) and second.shape == (2, 3, 3)


@pytest.mark.parametrize("device", DEVICES)
def test_train_mlp_example(device, tmp_path):
    """A short run of the training example: its own check (corrected_matmul's final loss within 1% of float32's)
    passes, and it writes its results."""
    pytest.importorskip("sklearn", reason="the example's data set comes with scikit-learn")
    pytest.importorskip("matplotlib", reason="the example plots its loss curves")
    result = subprocess.run([sys.executable, REPO_ROOT / "examples" / "train_mlp.py", "--device", device, "--epochs", "3",
                             "--out", tmp_path], capture_output=True, text=True, timeout=900, env=child_process_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    payload = json.loads((tmp_path / f"train_mlp_{device}.json").read_text())
    losses = payload["runs"]["corrected"]["losses"]
    assert len(losses) == 3 and losses[-1] < losses[0]  # it trained
    assert payload["corrected_vs_fp32_final_loss_gap"] <= 0.01
    assert (tmp_path / f"train_mlp_{device}.png").stat().st_size > 0


def test_readme_points_to_tests_and_files_that_exist():
    """Every test function README cites (`test_...`) is defined in tests/, and every test file and repository
    path it names (`tests/...`, `tools/...`, `benchmarks/...`, `examples/...`, `test_*.py`) or links to
    (`[text](path)`, other than web addresses) is there."""
    readme = (REPO_ROOT / "README.md").read_text()
    defined = {name for path in (REPO_ROOT / "tests").glob("test_*.py")
               for name in re.findall(r"^def (test_\w+)", path.read_text(), re.MULTILINE)}
    cited = set(re.findall(r"`(test_\w+)`", readme))
    assert cited and cited <= defined, f"README cites tests that do not exist: {sorted(cited - defined)}"
    paths = set(re.findall(r"`((?:tests|tools|benchmarks|examples)/[\w./-]+)`", readme))
    paths |= {f"tests/{name}" for name in re.findall(r"`(test_\w+\.py)`", readme)}
    links = {path for path in re.findall(r"\]\(([^)#\s]+)", readme) if "://" not in path}
    assert len(links) > 10
    paths |= links
    missing = sorted(p for p in paths if not (REPO_ROOT / p).exists())
    assert len(paths) > 10 and not missing, f"README names paths that do not exist: {missing}"


NUMBER_WORDS = {word: n for n, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen twenty".split())}


def test_readme_lists_every_environment_switch_the_sources_read():
    """README's table of environment variables has a row for each TORCH_WMMAE_ variable that the C++/CUDA sources
    read at a call (all but the build's TORCH_WMMAE_CPU_ONLY), no other rows, and the count its text gives; and the
    sources read them in one place (kernel_switches.cpp)."""
    sources = [p for p in (REPO_ROOT / "csrc").rglob("*") if p.suffix in {".cpp", ".cu", ".cuh", ".hpp", ".h"}]
    read = {name for path in sources for name in re.findall(r'"(TORCH_WMMAE_[A-Z0-9_]+)"', path.read_text())}
    assert len(read) > 5, read
    readme = (REPO_ROOT / "README.md").read_text()
    count = re.search(r"(\w+) environment variables, read at each call", readme)
    assert count, "README's sentence that counts the environment variables"
    table = readme[count.end():].split("\n\n", 2)[1]  # (the paragraph after the sentence's: the table)
    rows = re.findall(r"^\| `(TORCH_WMMAE_[A-Z0-9_]+)", table, re.MULTILINE)
    assert len(rows) == len(set(rows)), rows
    assert set(rows) == read, f"sources only: {sorted(read - set(rows))}, README only: {sorted(set(rows) - read)}"
    assert NUMBER_WORDS.get(count.group(1).lower()) == len(rows), (count.group(1), len(rows))
    # (One reader, which refuses values a switch does not take: a getenv elsewhere would read them unchecked.)
    readers = sorted(str(p.relative_to(REPO_ROOT)) for p in sources if "getenv" in p.read_text())
    assert readers == ["csrc/ops/kernel_switches.cpp"], readers
