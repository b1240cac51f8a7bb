"""The runtime's modules as ordinary imports inside the container: a bundle and its importer.

Standard library only, like every module here. On the host, :func:`pack` makes what a
container's stdin starts with (consumers/executor/hardening.py ``runner_preamble``): this module's
source, then the *bundle*: every ``.py`` of this package under its dotted name
(``rollstream.consumers.executor.runtime.codec``, ...), the parent packages as empty ones (the
host's ``__init__`` files are not sent), and the entry point (``module:function``), as one JSON
object with its keys sorted, so the same sources always give the same bytes (what
``runtime_identity`` digests). Each of the two comes after a line with its length.

In the container, the command line's one-line bootstrap (hardening.py ``BOOTSTRAP``) runs this
module's source as a module of its own and calls :func:`boot`, which reads the bundle and puts a
finder first on ``sys.meta_path`` that serves the bundle's names: the modules import each other
as on the host, with plain top-level imports of the same names. It imports the entry point's
module (and so every module its imports reach), then *seals* the bundle: the finder leaves
``sys.meta_path`` and every bundle module leaves ``sys.modules`` (each module's functions keep
their own globals), so nothing that runs later in the container, the completion or the tests,
can import the runtime, as nothing could when it was one source run as ``__main__``. No module
of the runtime may import another inside a function, then (tests/consumers/executor/
test_importer.py checks the sources). Then the entry point runs.

The finder and the loader have the methods the import system calls (``find_spec``;
``create_module``, ``exec_module``), without subclassing ``importlib.abc``'s: importing that
module pulls ``typing`` into PID 1 and every fork of it.
"""

import json
import sys
from importlib.machinery import ModuleSpec

PACKAGE = "rollstream.consumers.executor.runtime"
ENTRY = PACKAGE + ".supervisor:main"  # the runner (PID 1)
EGRESS_ENTRY = PACKAGE + ".egress:main"  # an egress proxy's container
ORIGIN = "<runner>"  # the bundle's files are <runner>/codec.py, ...: no file in the container


def frame(data):
    """``data`` after a line with its length: how the bootstrap and :func:`boot` read."""
    return str(len(data)).encode() + b"\n" + data


def pack(sources, entry=ENTRY, package=PACKAGE):
    """What the container's stdin starts with: this module's source (which the bootstrap runs),
    then the bundle, each framed. ``sources`` maps a file name of the package (``codec.py``,
    ``__init__.py``) to its text; ``entry`` is ``module:function``."""
    modules = {}
    parts = package.split(".")
    for depth in range(1, len(parts)):  # the parents: empty packages (the host's __init__ files stay there)
        modules[".".join(parts[:depth])] = ["", True, None]
    modules[package] = ["", True, f"{ORIGIN}/__init__.py"]
    for filename, source in sources.items():
        stem = filename[:-3] if filename.endswith(".py") else filename
        name = package if stem == "__init__" else f"{package}.{stem}"
        modules[name] = [source, stem == "__init__", f"{ORIGIN}/{filename}"]
    payload = json.dumps({"entry": entry, "modules": modules}, sort_keys=True, separators=(",", ":")).encode()
    return frame(sources["importer.py"].encode()) + frame(payload)


def unpack(stream):
    """The bundle from a binary ``stream`` positioned after the importer's frame, as a dict."""
    return json.loads(stream.read(int(stream.readline())))


class BundleLoader:
    """Loads one module of the bundle from its source."""

    def __init__(self, name, source, package, origin):
        self.name, self.source, self.package, self.origin = name, source, package, origin

    def create_module(self, spec):
        return None  # the import system's default module

    def exec_module(self, module):
        code = compile(self.source, self.origin or f"<{self.name}>", "exec", dont_inherit=True)
        exec(code, module.__dict__)

    def is_package(self, name):
        return self.package

    def get_source(self, name):
        return self.source


class BundleFinder:
    """First on ``sys.meta_path`` until the bundle is sealed: the bundle's modules by name."""

    def __init__(self, modules):
        self.loaders = {name: BundleLoader(name, *entry) for name, entry in modules.items()}

    def find_spec(self, name, path=None, target=None):
        loader = self.loaders.get(name)
        if loader is None:
            return None
        spec = ModuleSpec(name, loader, origin=loader.origin, is_package=loader.package)
        spec.has_location = False  # no file: __file__ is not set
        if loader.package:
            spec.submodule_search_locations = []
        return spec

    def install(self):
        sys.meta_path.insert(0, self)
        return self

    def seal(self):
        """No more imports of the bundle: the finder out of ``sys.meta_path``, its modules out of
        ``sys.modules`` (what was imported keeps working through its functions' globals)."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for name, loader in self.loaders.items():
            sys.modules.pop(name, None)
            loader.source = None  # nothing will compile it again


def boot(stream):
    """In the container (the bootstrap ran this module's source from ``stream``): read the
    bundle, import its entry point, seal the bundle, run the entry point (what it returns is the
    process's exit status, as ``sys.exit`` reads it)."""
    bundle = unpack(stream)
    finder = BundleFinder(bundle["modules"]).install()
    module_name, _, function = bundle["entry"].partition(":")
    del bundle  # the sources live in the loaders only, until the seal drops them
    try:
        __import__(module_name)
        entry = getattr(sys.modules[module_name], function)
    finally:
        finder.seal()
    return entry()
