"""The package as a Python developer meets it: typed (py.typed, in the wheel), checked by
``mypy --strict`` from user code, and runnable as ``python -m cogency``."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from cli_run import TESTS
from conftest import IN_CI

import cogency

SRC = Path(cogency.__file__).resolve().parent.parent
"""The sources under test (this worktree's, with PYTHONPATH pointing at them)."""


def _cache(name: str) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "cogency-ci" / name


def test_the_wheel_ships_py_typed(tmp_path):
    if not IN_CI:
        pytest.importorskip("hatchling", reason="hatchling (extra test) builds the wheel")
    from hatchling.builders.wheel import WheelBuilder

    [wheel] = list(WheelBuilder(str(SRC.parent)).build(directory=str(tmp_path),
                                                       versions=["standard"]))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "cogency/py.typed" in names and "cogency/__main__.py" in names
    assert {"cogency/server/static/swagger-ui/swagger-ui-bundle.js",
            "cogency/server/static/swagger-ui/LICENSE",
            "cogency/server/static/favicon.ico"} <= names


def test_user_code_type_checks_under_mypy_strict(tmp_path):
    """tests/typed/user_code.py uses the public API as a user would; mypy finds Cogency as an
    installed package (a .pth in a virtualenv, as `pip install -e` makes), so it reads the
    package's hints only because of py.typed (else: import-untyped, and every type is Any)."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "cogency_under_test.pth").write_text(f"{SRC}\n")
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--python-executable", str(python),
         "--config-file", str(config), "--cache-dir", str(_cache("mypy-user-code")),
         str(TESTS / "typed" / "user_code.py")],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={**os.environ, "PYTHONPATH": "", "MYPYPATH": ""},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("Success: no issues found in 1 source file")


def test_python_dash_m_cogency_is_the_command(tmp_path):
    version = subprocess.run([sys.executable, "-m", "cogency", "--version"],
                             capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout == f"cogency {cogency.__version__}\n"
    bare = subprocess.run([sys.executable, "-m", "cogency"], capture_output=True, text=True,
                          timeout=60)
    assert bare.returncode == 2 and "usage: cogency" in bare.stderr
