"""Faultline node agent and workload reporter: standard library plus optional nvidia-ml-py.

Nothing in this package imports the service (Django, Celery) or msgspec at runtime; a GPU
node installs and runs it without the server. `protocol.py` is the exception that proves
the rule: it is the contract the *tests* check the agent against, never imported here.
"""

__version__ = "0.1.0"
