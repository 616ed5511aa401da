"""The wheel users install, shipped models and all, stays under the package index's default limit of 100 MB."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pyserini_mores.models import SHIPPED_MODELS_DIR

ROOT = Path(__file__).resolve().parents[1]
INDEX_FILE_LIMIT_BYTES = 100 * 10**6


@pytest.mark.slow
def test_the_wheel_carries_every_shipped_model_and_stays_under_the_index_limit(tmp_path):
    # Built from a copy of what the wheel is made of, so that the build leaves nothing in the working tree.
    source = tmp_path / "source"
    shutil.copytree(ROOT / "pyserini_mores", source / "pyserini_mores",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("setup.cfg", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "--quiet", "--wheel-dir", str(tmp_path / "dist"), str(source)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    [wheel] = (tmp_path / "dist").glob("pyserini_mores-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = [path.relative_to(ROOT).as_posix() for path in SHIPPED_MODELS_DIR.glob("*/*") if path.is_file()]
    assert shipped and not set(shipped) - names, sorted(set(shipped) - names)
    size = wheel.stat().st_size
    assert size <= INDEX_FILE_LIMIT_BYTES, f"the wheel takes {size / 1e6:.1f} MB; the package index takes 100 MB"
