"""The wheels users install — the package's own and the models package's built from this repository, shipped models
and all — each stay under the package index's default limit of 100 MB and carry every model they ship; the package's
regular and editable wheels both carry the start-up hook's ``.pth`` file."""
from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pyserini_mores.models import MODELS_PACKAGE, SHIPPED_MODELS_DIR

from conftest import MODELS_PACKAGE_MODELS, MODELS_PACKAGE_SOURCE

ROOT = Path(__file__).resolve().parents[1]
INDEX_FILE_LIMIT_BYTES = 100 * 10**6
#: each wheel: the directory it is built from, its package, and the directory of the models it ships
WHEELS = {
    "pyserini-mores": (ROOT, "pyserini_mores", SHIPPED_MODELS_DIR),
    MODELS_PACKAGE: (MODELS_PACKAGE_SOURCE, "pyserini_mores_models", MODELS_PACKAGE_MODELS),
}
#: the start-up hook (setup.py puts the .pth file at the top of site-packages) and the line the .pth file runs
HOOK_PTH = "pyserini_mores_hook.pth"
HOOK_LINE = "import pyserini_mores._start_hook; pyserini_mores._start_hook.install()\n"
TOP_LEVEL_FILES = ("setup.cfg", "setup.py", "MANIFEST.in", "README.md")


def _source_copy(root: Path, package: str, destination: Path) -> Path:
    """A copy of what a wheel is made of, so that a build leaves nothing in the working tree."""
    shutil.copytree(root / package, destination / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in TOP_LEVEL_FILES:
        if (root / name).exists():
            shutil.copy2(root / name, destination / name)
    return destination


@pytest.mark.slow
@pytest.mark.parametrize("distribution", sorted(WHEELS))
def test_each_wheel_carries_every_model_it_ships_and_stays_under_the_index_limit(distribution, tmp_path):
    root, package, models = WHEELS[distribution]
    source = _source_copy(root, package, tmp_path / "source")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "--quiet", "--wheel-dir", str(tmp_path / "dist"), str(source)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    [wheel] = (tmp_path / "dist").glob(f"{package}-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = [path.relative_to(root).as_posix() for path in models.glob("*/*") if path.is_file()]
    assert shipped and not set(shipped) - names, sorted(set(shipped) - names)
    size = wheel.stat().st_size
    assert size <= INDEX_FILE_LIMIT_BYTES, f"the wheel takes {size / 1e6:.1f} MB; the package index takes 100 MB"


def _record_line(wheel: zipfile.ZipFile, name: str) -> str:
    [record] = [entry for entry in wheel.namelist() if entry.endswith(".dist-info/RECORD")]
    lines = [line for line in wheel.read(record).decode().splitlines() if line.startswith(name + ",")]
    assert len(lines) == 1, lines
    return lines[0]


def _expected_record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["regular", "editable"])
def test_the_wheels_carry_the_start_up_hook(kind, tmp_path):
    """``pip install .`` and ``pip install -e .`` each install the .pth file (recorded, so uninstalling removes it)
    and the hook module it imports (the editable wheel maps it to the source tree)."""
    source = _source_copy(ROOT, "pyserini_mores", tmp_path / "source")
    build = "build_wheel" if kind == "regular" else "build_editable"
    script = f"from setuptools import build_meta; print(build_meta.{build}({str(tmp_path / 'dist')!r}))"
    (tmp_path / "dist").mkdir()
    built = subprocess.run([sys.executable, "-c", script], cwd=source, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = zipfile.ZipFile(tmp_path / "dist" / built.stdout.split()[-1])
    assert wheel.read(HOOK_PTH).decode() == HOOK_LINE
    assert _record_line(wheel, HOOK_PTH) == _expected_record_line(HOOK_PTH, HOOK_LINE.encode())
    if kind == "regular":
        assert wheel.read("pyserini_mores/_start_hook.py") == (ROOT / "pyserini_mores" / "_start_hook.py").read_bytes()
