"""`taskformer new-task` writes a package that installs with pip, runs by name, and passes its own test."""
import filecmp
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "taskformer-reverse"
VARIANTS = ("encoder-decoder", "encoder-only", "tagging", "decoder-only", "encoder-only --pairs")


def _build_output(path):
    """What `pip install -e` and Python leave beside the sources (git ignores these too)."""
    return any(part == "__pycache__" or part.endswith(".egg-info") or part == "build" for part in path.parts)


def test_scaffold_for_reverse_is_the_example_package(tmp_path, cli):
    result = cli("new-task", "reverse", "--dir", str(tmp_path / "pkg"))
    assert result.exit_code == 0, result.output
    written = sorted(p.relative_to(tmp_path / "pkg") for p in (tmp_path / "pkg").rglob("*") if p.is_file())
    shipped = sorted(p.relative_to(EXAMPLE) for p in EXAMPLE.rglob("*") if p.is_file() and not _build_output(p))
    assert written == shipped
    for rel in written:
        assert filecmp.cmp(tmp_path / "pkg" / rel, EXAMPLE / rel, shallow=False), rel


@pytest.mark.slow
def test_every_variant_installs_runs_and_passes_its_own_test(tmp_path, cli):
    """One package per variant, installed by one pip call; their own tests run in one pytest."""
    site = tmp_path / "site"
    names = [f"demo-{variant.replace(' --', '-')}" for variant in VARIANTS]  # demo-encoder-only-pairs
    packages = {name: tmp_path / name for name in names}
    for (name, pkg), variant in zip(packages.items(), VARIANTS):
        assert cli("new-task", name, "--variant", *variant.split(), "--dir", str(pkg)).exit_code == 0
    install = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                              "--target", str(site), *map(str, packages.values())], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr
    env = {"PYTHONPATH": str(site)}
    listed = run_cli("tasks", env=env)
    rows = {line.split()[1]: line.split()[3] for line in listed.stdout.splitlines() if "demo-" in line}
    assert rows == {"demo-encoder-decoder": "encoder-decoder", "demo-encoder-only": "encoder-only",
                    "demo-tagging": "tagging", "demo-decoder-only": "decoder-only",
                    "demo-encoder-only-pairs": "encoder-only"}, listed.stdout
    assert "taskformer_demo" not in listed.stderr
    own_tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                *(str(pkg / "tests") for pkg in packages.values())],
                               capture_output=True, text=True, env={**os.environ, **env}, cwd=tmp_path)
    assert own_tests.returncode == 0, own_tests.stdout[-2000:]
    assert "10 passed" in own_tests.stdout


def test_scaffold_refuses_bad_names_and_existing_folders(tmp_path, cli):
    bad = cli("new-task", "My Task", "--dir", str(tmp_path / "x"))
    assert bad.exit_code == 2 and "lower-case" in bad.stderr
    unknown = cli("new-task", "ok", "--variant", "seq2seq", "--dir", str(tmp_path / "y"))
    assert unknown.exit_code == 2 and "'seq2seq' is not one of" in unknown.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    taken = cli("new-task", "ok", "--dir", str(tmp_path / "full"))
    assert taken.exit_code == 2 and "not empty" in taken.stderr
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"


def test_new_task_takes_exactly_the_variants_the_guide_lists(tmp_path, cli):
    readme = (Path(__file__).resolve().parents[1] / "docs" / "guide.md").read_text(encoding="utf-8")
    listed = re.search(r"`taskformer new-task NAME \[--variant ([\w/-]+)\]", readme).group(1).split("/")
    offered = re.search(r"--variant \[([\w|-]+)\]", cli("new-task", "--help").output).group(1).split("|")
    assert offered == listed
    alias = cli("new-task", "ok", "--variant", "classification", "--dir", str(tmp_path / "x"))
    assert alias.exit_code == 2 and "'classification' is not one of" in alias.stderr
