"""Hosting the explorer for a lecture: several app processes behind HAProxy over one store (hosting.launch). The demo's
policy, limits and operator state are demo.py, demo_limits.py and demo_operator.py; the store is appstate.store."""
