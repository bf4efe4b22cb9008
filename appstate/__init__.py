"""The app's state, without Streamlit: model loaders, the byte-bounded trace cache, and a page's last run.

views/ keeps one instance of each per process (st.cache_resource) or per session (st.session_state, passed in
as a plain mapping), so everything here is unit-tested without a browser.

    loaders = Loaders(max_models=4, max_bytes=6 << 30)   # both bounds; LRU out first, `evictions` says what went
    ldr = loaders.get(key)            # starts loading in a background thread; ldr.done / .fraction / .error
    loaders.forget(key)               # only this model (a failed load never evicts the others)
    traces = TraceCache(budget_bytes)
    tr = traces.get(key, make)        # shared by every session, least recently used out first
    runs = RunStore(); runs.attach(state, browser_id, new_id, address)   # a browser's runs, restored after a refresh
    remember(state, "gen", model_key, record); recall(state, "gen", model_key)
"""

from appstate.caches import LRU, CheckResults, TraceCache, default_trace_budget
from appstate.models import MODELS_ROOT_ENV, Eviction, Loader, Loaders, default_model_budget, folder_refusal, load_warm, models_roots
from appstate.stores import DAY, RUNS, Full, OwnedStore, RunStore, SharedTexts, forget_run, recall, remember

__all__ = [
    "DAY", "LRU", "MODELS_ROOT_ENV", "RUNS", "CheckResults", "Eviction", "Full", "Loader", "Loaders", "OwnedStore", "RunStore",
    "SharedTexts", "TraceCache", "default_model_budget", "default_trace_budget", "folder_refusal", "forget_run", "load_warm",
    "models_roots", "recall", "remember",
]  # fmt: skip
