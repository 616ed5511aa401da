"""Metadata lives in setup.cfg; this file adds the start-up hook's ``.pth`` file to both kinds of wheel.

A ``.pth`` file must sit at the top of site-packages, where no package directory puts it: ``build_py`` copies it
into the regular wheel, and ``editable_wheel`` (what ``pip install -e .`` builds) adds it to the editable wheel,
which holds no built files of its own.
"""
from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

HOOK_PTH = "pyserini_mores_hook.pth"
#: what the .pth file runs at interpreter start (see pyserini_mores/_start_hook.py)
HOOK_LINE = "import pyserini_mores._start_hook; pyserini_mores._start_hook.install()\n"


class BuildPyWithHook(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            (Path(self.build_lib) / HOOK_PTH).write_text(HOOK_LINE)


class EditableWheelWithHook(editable_wheel):
    def run(self) -> None:
        super().run()
        name = self.distribution.get_name().replace("-", "_")
        for wheel in Path(self.dist_dir).glob(f"{name}-{self.distribution.get_version()}-0.editable-*.whl"):
            _add_to_wheel(wheel, HOOK_PTH, HOOK_LINE.encode())


def _add_to_wheel(wheel: Path, name: str, data: bytes) -> None:
    """Add a top-level file to a built wheel, with its line in the wheel's ``RECORD`` (PEP 376/427 format)."""
    with zipfile.ZipFile(wheel) as archive:
        entries = [(info, archive.read(info)) for info in archive.infolist() if info.filename != name]
    [record] = [info for info, _ in entries if info.filename.endswith(".dist-info/RECORD")]
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record_text = dict(entries)[record].decode()
    record_text = "".join(line for line in record_text.splitlines(keepends=True) if not line.startswith(name + ","))
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(name, data)
        for info, content in entries:
            archive.writestr(info, f"{name},sha256={digest},{len(data)}\n{record_text}" if info is record else content)


setup(cmdclass={"build_py": BuildPyWithHook, "editable_wheel": EditableWheelWithHook})
