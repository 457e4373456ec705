"""The code passes ruff (pyflakes, pycodestyle, import order, bugbear, pyupgrade) and mypy, both configured
in pyproject.toml, with no finding: the package, its tests and the bench scripts, so the suite that CI runs
also holds the lint and the types."""
import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # lints the package: the full run's, not the quick tier's

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["tests", "bench"]  # scripts, not packages: mypy finds the helpers they import (conftest, machine) among them


def test_ruff_finds_nothing():
    # through the interpreter, as mypy is: the ruff binary need not be on PATH (an environment layered on another)
    assert importlib.util.find_spec("ruff"), "ruff is part of the test extra: pip install -e '.[test]'"
    found = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "core", "plugins", "tasks", "taskformer",
                            *SCRIPTS], cwd=ROOT, capture_output=True, text=True)
    assert found.returncode == 0, found.stdout + found.stderr


def installed_layout(into: Path) -> Path:
    """The package laid out under ``into`` as it installs, ``taskformer/core`` for ``core/`` and so on, in
    links to the source folders that pyproject.toml's package-dir maps: mypy finds a package by its
    folders and cannot follow the import hook of setuptools' editable install."""
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    top = into / "taskformer"
    top.mkdir(parents=True)
    for entry in (ROOT / folders["taskformer"]).iterdir():
        (top / entry.name).symlink_to(entry)
    for package, folder in folders.items():
        place = into.joinpath(*package.split("."))
        if not place.exists():  # taskformer.plugins.builtin is inside plugins/ already
            place.symlink_to(ROOT / folder, target_is_directory=True)
    return into


def test_mypy_finds_nothing(tmp_path):
    """mypy over the package as installed, then over the scripts of tests/ and bench/, which import it."""
    assert importlib.util.find_spec("mypy"), "mypy is part of the test extra: pip install -e '.[test]'"
    tree = installed_layout(tmp_path / "tree")
    scripts = [str(path) for folder in SCRIPTS for path in sorted((ROOT / folder).rglob("*.py"))]
    mypy = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(tmp_path / "cache")]
    package = subprocess.run([*mypy, "-p", "taskformer"], cwd=tree, capture_output=True, text=True)
    assert package.returncode == 0, ("paths as installed (taskformer/core/ is core/):\n" + package.stdout + package.stderr)
    # a second run (mypy takes a package or files, not both), the package's analysis read from the first one's cache
    found = subprocess.run([*mypy, *scripts], cwd=tree, capture_output=True, text=True)
    assert found.returncode == 0, found.stdout + found.stderr


def test_no_module_of_the_package_is_over_550_lines():
    """A module past about 550 lines holds more than one idea: split it rather than grow it."""
    long = {str(path.relative_to(ROOT)): n for folder in ("core", "plugins", "tasks", "taskformer")
            for path in (ROOT / folder).rglob("*.py") if (n := len(path.read_text().splitlines())) > 550}
    assert not long, long
