"""Start-up hook of pyserini-mores: lets Pyserini itself start its JVM in any program, whatever the system Java.

``pyserini_mores_hook.pth`` (which setup.py installs at the top of site-packages) imports this module when Python
starts, with the package's ``__init__`` (which imports nothing more), and it puts a finder on ``sys.meta_path``
that finds nothing itself: it only watches two imports, and leaves every other one, in programs that never import
Pyserini, to the next finder after one string comparison.

- ``jnius`` (the import that starts the JVM), when Pyserini has put its Anserini jar on the class path: first point
  ``JAVA_HOME`` and ``PATH`` at a Java 21+ runtime where the current one is older or absent, and start the JVM with
  options that runtime supports (:func:`pyserini_mores._jvm.prepare_anserini_jvm`).
- ``pyserini.encode._openai``, which builds an OpenAI client at import: without credentials it gets a client that is
  built on first use instead (:mod:`pyserini_mores._openai_deferred`).

Here and in the package's ``__init__`` only a few small standard-library modules are imported: the
work is done by the package's modules, imported when one of the two imports happens.
"""
import sys

WATCHED = frozenset(("jnius", "pyserini.encode._openai"))


class PyseriniStartHook:
    """A meta-path finder that prepares the two watched imports and lets the other finders find them."""

    def __init__(self):
        self.active = False  # (re-entry guard: preparing an import may import the same name)

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in WATCHED or self.active:
            return None
        self.active = True
        try:
            from pyserini_mores._pyserini_start import prepared_spec

            return prepared_spec(self, fullname, path, target)
        finally:
            self.active = False


def install():
    """Put the hook first on ``sys.meta_path``, once per interpreter."""
    if not any(isinstance(finder, PyseriniStartHook) for finder in sys.meta_path):
        sys.meta_path.insert(0, PyseriniStartHook())
