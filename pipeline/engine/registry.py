"""Which engine serves a model: the one in this process (made on first use, kept on the model: it lives exactly as long as the model does), or,
when the process was started with LLM_EXPLORER_ENGINE set (ray://host:port, or auto), the model's application on
Ray Serve (engine.ray_serve), which takes the same requests and streams the same events. The setting is read
once, at import; `use_remote()` changes it (tests, the CLI)."""

from __future__ import annotations

import os

from pipeline.engine.core import Engine
from pipeline.model.loaded import LoadedModel

ENV = "LLM_EXPLORER_ENGINE"

_remote_address: str | None = os.environ.get(ENV) or None


def use_remote(address: str | None) -> None:
    """Serve every model from Ray Serve at `address` from now on (None: in this process)."""
    global _remote_address
    _remote_address = address or None


def engine_for(lm: LoadedModel):
    """The one shared engine of this loaded model: an Engine in this process, or a RemoteEngine on Ray Serve."""
    if _remote_address:
        from pipeline.engine.ray_serve import remote_engine

        return remote_engine(lm.key, _remote_address)
    return lm.owned("engine", Engine)  # kept on the model: freed with it (its worker thread ends)
