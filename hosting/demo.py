"""Demo mode: what a hosted explorer lets a visitor make the server do. Without Streamlit, unit-tested.

One switch turns it on: `LLM_EXPLORER_DEMO=1` (what `make demo` sets), or `enabled = true` in a `[demo]` section
of .streamlit/secrets.toml (the operator's file, never in git), which may also set the model allowlist, any cap
and the operator page's password:

    [demo]
    enabled = true
    models = ["smollm2-135m-instruct", "/srv/models/my-model"]   # model keys or folders; default: the embedded model
    operator_password = "..."
    new_tokens = 96                                              # any field of Caps (0: no limit)

    policy = load_policy(secrets)       # secrets: a mapping (st.secrets), or None
    policy.enabled, policy.models, policy.caps.new_tokens

A cap of 0 (or less) is no limit, written None in the policy (None is the one spelling of "no limit": Caps, the pages'
controls through views.guard, the rate limits and the queues all read it so). Outside demo mode nothing limits
anything (caps are the pages' own maxima, no queue, no rate limit).

demo is the face of three modules, by concern: this file holds the policy (Caps, Policy, load_policy, the operator's secrets
file) and `python -m hosting.demo`, the warm-up `make demo` runs; hosting.limits the limits on starting runs (RateLimiter,
AddressSlots, FairQueue, Busy, unlimited); hosting.operator_state what the operator page keeps and guards (ErrorLog,
PasswordGuard, Sessions). Their names are importable from here (`hosting.demo.RateLimiter`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from hosting.limits import AddressSlots, Busy, FairQueue, RateLimiter, limit_of, unlimited
from hosting.operator_state import ErrorLog, PasswordGuard, Sessions

__all__ = [
    "UNCAPPED",
    "AddressSlots",
    "Busy",
    "LIMITS",
    "Caps",
    "ErrorLog",
    "FairQueue",
    "PasswordGuard",
    "Policy",
    "RateLimiter",
    "Sessions",
    "limit_of",
    "load_policy",
    "secrets_file",
    "unlimited",
    "warm",
]


@dataclass(frozen=True)
class Caps:
    """What one visitor may ask of a demo server (each shown next to its control)."""

    prompt_tokens: int | None = 512  # tokens in a traced or generated prompt
    new_tokens: int | None = 128  # tokens one generation may produce (the generation, hardware, production, speculative and batching pages)
    sweep_tokens: int | None = 1024  # the longest prompt of a sweep (the prefill/decode, roofline and attention-kernels pages)
    repeats: int | None = 3  # timed repeats of a sweep point
    users: int | None = 8  # users in the batching page's scene
    requests_per_minute: int | None = 20  # runs one browser may start per minute (generations, sweeps, traces, tokenizing)
    address_at_once: int | None = 40  # runs one client address may have queued or running at once (a class behind one NAT fits)
    address_per_minute: int | None = 400  # runs one client address may start per minute, whatever its sessions or cookies
    classes_per_hour: int | None = 5  # live classes one client address (and one browser) may start per hour
    tokenize_chars: int | None = 20_000  # characters the tokens page tokenizes (outside demo mode: the prompt box's 200,000)
    heavy_at_once: int | None = 1  # heavy experiments running at once on the server (the rest wait in line, fairly)
    compile: bool = False  # production mode's torch.compile (a minute of the whole server's CPU)
    draft_folders: bool = False  # speculative decoding with a draft model from a typed folder

    def __post_init__(self):
        """Each limit in its one spelling (hosting.limits.limit_of): a positive int, or None for no limit, however this
        Caps was made (the loader, a test's dataclasses.replace): an operator's 0 is None here, never a cap of 0."""
        for name in LIMITS:
            object.__setattr__(self, name, limit_of(getattr(self, name)))


LIMITS = tuple(f.name for f in fields(Caps) if f.type != "bool")  # the numeric caps (the rest are switches)

UNCAPPED = Caps(  # outside demo mode: no limit on anything
    prompt_tokens=None,
    new_tokens=None,
    sweep_tokens=None,
    repeats=None,
    users=None,
    requests_per_minute=None,
    address_at_once=None,
    address_per_minute=None,
    classes_per_hour=None,
    tokenize_chars=None,
    heavy_at_once=None,
    compile=True,
    draft_folders=True,
)


@dataclass(frozen=True)
class Policy:
    enabled: bool = False
    models: tuple[str, ...] = ()  # the allowlist (model keys or folders); empty outside demo mode
    caps: Caps = UNCAPPED
    operator_password: str | None = None

    def allows_model(self, key: str) -> bool:
        return not self.enabled or key in self.models


def _truthy(v) -> bool:
    return str(v).strip().lower() in {"1", "true", "yes", "on"}


def load_policy(secrets: Mapping | None = None, environ: Mapping | None = None) -> Policy:
    """The policy from the environment and the `[demo]` section of the secrets (either can switch it on)."""
    from pipeline.model import DEFAULT, canonical_key

    env = os.environ if environ is None else environ
    sec = dict((secrets or {}).get("demo", {}) or {})
    password = sec.get("operator_password") or env.get("LLM_EXPLORER_OPERATOR_PASSWORD") or None
    if not (_truthy(env.get("LLM_EXPLORER_DEMO", "")) or _truthy(sec.get("enabled", False))):
        return Policy(operator_password=password)
    listed = sec.get("models") or [m for m in env.get("LLM_EXPLORER_MODELS", "").split(",") if m.strip()] or [DEFAULT]
    # a limit as written (an int or a string of one; 0 or less is no limit: None), a switch as TOML's true/false
    caps = replace(Caps(), **{f.name: limit_of(sec[f.name]) if f.name in LIMITS else _truthy(sec[f.name]) for f in fields(Caps) if f.name in sec})
    # LLM_EXPLORER_PRECISION=int8 (`make demo PRECISION=int8`): every listed model served in int8 weight-only, a key
    # ending ":int8" (pipeline.model.quantised); a key listed with its own ":int8" is int8 whatever the setting
    tail = ":int8" if env.get("LLM_EXPLORER_PRECISION", "").strip().lower() == "int8" else ""
    return Policy(True, tuple(canonical_key(str(m).strip() + tail) for m in listed), caps, password)


def secrets_file(root: str = ".") -> dict:
    """The operator's .streamlit/secrets.toml as a dict (what st.secrets reads), {} when there is none."""
    import tomllib

    path = os.path.join(root, ".streamlit", "secrets.toml")
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        return {}


def warm(out=None) -> int:
    """`python -m hosting.demo`: build each allowlisted model's cache and load it once, before the server opens (so no
    visitor waits for the one-time conversion). Exit status 1 if a model cannot load."""
    import sys

    from pipeline.model import ModelLoadError, load_model

    out = out or sys.stdout
    policy = load_policy(secrets_file(), {**os.environ, "LLM_EXPLORER_DEMO": "1"})
    status = 0
    for key in policy.models:
        t = time.perf_counter()
        try:
            lm = load_model(key)
            out.write(f"{lm.label}: ready in {time.perf_counter() - t:.1f} s\n")
        except ModelLoadError as e:
            out.write(f"{key}: {e}\n")
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(warm())
