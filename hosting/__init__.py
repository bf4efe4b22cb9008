"""The hosted explorer: everything a server for a class needs beyond the app itself.

    demo.py            demo mode's policy and caps (`demo.Caps`, `[demo]` in secrets.toml): what a visitor may make the server do
    limits.py          the limits that policy sets (rate per browser and address, places at once, the fair queue)
    operator_state.py  what the operator page keeps and guards (errors by request id, sessions seen, the password)
    store.py           THE store for what outlives a session (SQLite by default, Redis by URL): classes, links, runs, counters
    explorer.py        `llm-explorer`: one Streamlit process of the app, the same options as `make run`
    launch.py          a lecture hall: N app processes over one store, supervised
    balancer.py        HAProxy in front of them (sticky cookies, websockets, health checks)

Streamlit-free, and below the app's state (appstate/ and views/ import it; it imports neither)."""
