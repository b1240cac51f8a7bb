"""The in-container runtime of the sandbox: standard library only. Each container gets every
module of this package as a bundle on its stdin and imports them under these same names
(runtime/importer.py; the entry point is supervisor.py's ``main``); on the host, ordinary modules."""
