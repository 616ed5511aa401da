"""What the start-up hook (``_start_hook``) does when Pyserini starts its JVM or imports its OpenAI module.

Both imports are found by the finders after the hook; the hook returns their spec with the loader wrapped, so that
the preparation runs just before the module's code and the follow-up just after it.
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from importlib.machinery import ModuleSpec


class _WrappedLoader:
    """``loader`` whose ``exec_module`` runs inside ``around()`` (a context manager); everything else is delegated."""

    def __init__(self, loader, around: Callable[[], contextlib.AbstractContextManager]) -> None:
        self._loader, self._around = loader, around

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        with self._around():
            self._loader.exec_module(module)

    def __getattr__(self, name: str):
        return getattr(self._loader, name)


def _spec_of_the_other_finders(hook, fullname: str, path, target) -> ModuleSpec | None:
    for finder in sys.meta_path:
        if finder is hook or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(fullname, path, target)
        if spec is not None:
            return spec
    return None


def _starts_anserini() -> bool:
    """Whether the coming JVM start is Pyserini's: Anserini's jar is on the class path pyjnius will use."""
    jnius_config = sys.modules.get("jnius_config")
    if jnius_config is None or jnius_config.vm_running:
        return False
    from ._jvm import is_anserini_jar

    return any(is_anserini_jar(entry) for entry in (jnius_config.classpath or []))


@contextlib.contextmanager
def _jvm_started_for_anserini():
    from . import _jvm

    _jvm.prepare_anserini_jvm()
    yield
    _jvm.after_jvm_start()


def prepared_spec(hook, fullname: str, path, target) -> ModuleSpec | None:
    """The spec of ``fullname`` (``jnius`` or ``pyserini.encode._openai``) with its preparation attached, or
    ``None`` to let the import go on untouched."""
    if fullname == "jnius":
        if not _starts_anserini():
            return None  # (someone else's JVM, or one already running: not ours to configure)
        around = _jvm_started_for_anserini
    else:
        from ._openai_deferred import openai_clients_deferred

        around = openai_clients_deferred
    spec = _spec_of_the_other_finders(hook, fullname, path, target)
    if spec is None or spec.loader is None:
        return spec
    spec.loader = _WrappedLoader(spec.loader, around)
    return spec
