"""The wheels users install — the package's own and the models package's built from this repository, shipped models
and all — each stay under the package index's default limit of 100 MB and carry every model they ship."""
from __future__ import annotations

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


@pytest.mark.slow
@pytest.mark.parametrize("distribution", sorted(WHEELS))
def test_each_wheel_carries_every_model_it_ships_and_stays_under_the_index_limit(distribution, tmp_path):
    root, package, models = WHEELS[distribution]
    # Built from a copy of what the wheel is made of, so that the build leaves nothing in the working tree.
    source = tmp_path / "source"
    shutil.copytree(root / package, source / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("setup.cfg", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy2(root / name, source / name)
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
