"""The in-container runtime of the sandbox: standard library only, sent to each container as one
source in the order consumers/executor/sandbox.py:RUNTIME gives (on the host, ordinary modules)."""
