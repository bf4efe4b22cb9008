"""Live classes, without Streamlit: a presenter's browser owns a class under a short code; every view it shows (page,
model, prompt, chat mode, the page's settings) is published as a numbered View; followers ask for the current view
(a heartbeat, which is also how they are counted) and apply it when its number moved on.

    classes = Classes(idle_s=3600)
    c = classes.start(owner="<presenter's browser id>")      # the same class again for the same browser; Full at the limit
    classes.publish(c.code, owner, "attention", {...})        # only the owner can
    classes.beat(c.code, owner)                                # the presenter's open tab: the class is not idle
    view = classes.follow(code, follower="<session id>")     # Ended: no such class now (or, to one who was in it, why it ended)
    classes.shown(code, follower, view.number)                # the follower's page finished drawing that view
    classes.hand(code, owner, frozen_view_id); classes.handed(code)   # the presenter's results, as a frozen copy
    classes.followers(code); classes.caught_up(code); classes.end(code, owner); classes.close(code, why)  # the operator's

Who can end a class: its presenter, the operator, or time (no presenter heartbeat and nothing published for `idle_s`).
Nobody else: at the limit a new class is refused, never made room for. Every class lives in the one store
(hosting.store): a presenter on one app process and students on others are one class, and a restart loses none. Codes are 8 characters from 31 without
look-alikes (no 0/o, 1/l/i): 31^8 = 8.5e11 codes; a code that names no running class gets one message whether it never
existed or has ended (only a follower who was in the class learns why it ended), and the page counts it against the
visitor's limits (views.live). A follower learns the view, never the owner's browser id; a published view never holds a
key that starts with "_" (a session's private state), whatever the caller passes.
"""

from __future__ import annotations

import json
import pickle
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from hosting.store import Store, open_store

ALPHABET = "23456789abcdefghjkmnpqrstuvwxyz"  # 31 characters: no 0, 1, i, l, o
CODE_LEN = 8
SEEN_S = 6.0  # a follower counts while its last heartbeat is this recent (they beat every second)


def no_class(code: str) -> str:
    """The one message for a code that names no running class: never existed, ended or expired read the same."""
    return f"There is no live class with the code {code!r} on this server now."


def is_code(text: str | None) -> bool:
    """Whether `text` has a code's shape (8 characters of ALPHABET); checked before any lookup."""
    return isinstance(text, str) and len(text) == CODE_LEN and all(c in ALPHABET for c in text)


@dataclass
class View:
    """What the presenter shows: the page's slug and the widget state that makes it (typed values by key)."""

    number: int
    slug: str
    state: dict[str, Any]
    at: float


@dataclass
class Question:
    """ "What comes next?": the presenter's prompt and the candidates offered, the class's answers (one per browser,
    the latest counts; kept by browser id on the server, never shown), whether only the offered choices are taken (no
    typed words), the answers the presenter hid from the chart, and whether the model's answer is revealed."""

    number: int
    prompt: str
    options: list[str]
    choices_only: bool = False
    answers: dict[str, str] = field(default_factory=dict)
    hidden: set[str] = field(default_factory=set)
    revealed: bool = False
    answer: str | None = None  # the model's, set when revealed

    def tally(self, hidden: bool = False) -> dict[str, int]:
        """Guesses by text (as typed, trimmed), most common first; the ones the presenter hid only with `hidden`."""
        out: dict[str, int] = {}
        for a in self.answers.values():
            if hidden or a not in self.hidden:
                out[a] = out.get(a, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


MAX_ANSWER_CHARS = 40
MIN_ANSWER_GAP_S = 2.0  # one answer per browser every 2 seconds at most
BEAT_WRITE_S = 2.0  # a follower's heartbeat is written to the store at most this often (it is read every beat)
ENDED_KEEP_S = 86400.0  # how long an ended class's followers can learn why it ended
CHANGES = "classes"  # the store's change number: moves whenever a follower has something new to see


@dataclass
class LiveClass:
    """A class as the store keeps it (one record; its followers' heartbeats are entries of their own). What start()
    and of_owner() return is a snapshot."""

    code: str
    owner: str
    started: float
    last_active: float  # the presenter's last heartbeat, publish or click
    view: View | None = None
    ended: bool = False
    question: Question | None = None
    handed: tuple[int, str] | None = None  # (number, a frozen view's id): the presenter's results handed to the class
    _answered: dict[str, float] = field(default_factory=dict)


class Ended(LookupError):
    """The code names no running class. `member`: the follower asking was in it (the message then says why it ended);
    otherwise the message is no_class(code) whatever happened, and the page counts it as a wrong code."""

    def __init__(self, message: str, member: bool = False):
        super().__init__(message)
        self.member = member


class Full(RuntimeError):
    """The server runs as many live classes as it may: a new one is refused (no running class is ever ended for it)."""


class Classes:
    """Every live class of this server (every process on the store), thread- and process-safe: a change is one locked
    read-modify-write of the class's record. A class whose presenter neither beat (an open tab), published nor clicked
    for `idle_s` expires; at most `max_classes` run at once, and a start beyond that is refused (Full). Without a
    `store`, a private in-memory one (a test's). The store's change number CHANGES moves with everything a follower
    must see (a view, a hand-over, a question, the end), so a process wakes its followers by polling one number."""

    def __init__(self, idle_s: float = 3600, max_classes: int = 64, clock=time.time, store: Store | None = None):
        self.idle_s, self.max_classes, self._clock = idle_s, max_classes, clock
        self.store = store if store is not None else open_store(":memory:")
        self._beats: OrderedDict[tuple[str, str], float] = OrderedDict()  # (code, follower) -> when last written here
        self._mu = threading.Lock()
        self._expired_at = -1e18

    # -- records ----------------------------------------------------------------------------------------------------
    def _load(self, code: str) -> LiveClass | None:
        raw = self.store.get("classes", code) if is_code(code) else None
        return None if raw is None else pickle.loads(raw)

    def _save(self, c: LiveClass, changed: bool = False) -> None:
        self.store.put("classes", c.code, pickle.dumps(c, protocol=pickle.HIGHEST_PROTOCOL))
        if changed:
            self.store.bump(CHANGES)

    def _all(self) -> list[LiveClass]:
        return [pickle.loads(v) for v in self.store.items("classes").values()]

    def _seen(self, code: str) -> dict[str, dict]:
        return {k: json.loads(v) for k, v in self.store.items("seen:" + code).items()}

    def _mine(self, code: str, owner: str, what: str = "This live class is not yours, or it has ended.") -> LiveClass:
        c = self._load(code)
        if c is None or c.owner != owner:
            raise Ended(what)
        return c

    def _expire(self, now: float, force: bool = False) -> None:
        """End the classes idle for idle_s (looked at most every 5 s per process unless `force`)."""
        if not force and now - self._expired_at < 5.0:
            return
        self._expired_at = now
        for c in self._all():
            if now - c.last_active > self.idle_s:
                with self.store.lock("classes"):
                    c = self._load(c.code)
                    if c is not None and now - c.last_active > self.idle_s:
                        self._close(c.code, "expired: its presenter's page was closed for a while")

    def _close(self, code: str, why: str) -> None:
        c = self._load(code)
        if c is None:
            return
        self.store.put("ended", code, why.encode(), ttl_s=ENDED_KEEP_S)
        self.store.delete("classes", code)
        self.store.delete("owners", c.owner)
        self.store.bump(CHANGES)

    # -- the presenter ----------------------------------------------------------------------------------------------
    def start(self, owner: str) -> LiveClass:
        """The owner's live class: a new one, or the one this browser already runs (every tab drives the same). Full
        (with a message for the page) when the server runs `max_classes` already."""
        now = self._clock()
        self._expire(now, force=True)
        with self.store.lock("classes"):
            mine = self._of(owner)
            if mine is not None:
                return mine
            if len(self.store.items("classes")) >= self.max_classes:
                raise Full(
                    f"This server runs {self.max_classes} live class{'es' if self.max_classes != 1 else ''} already, the most it may: "
                    "no class was started. "
                    f"A class ends when its presenter ends it, or {self.idle_s / 60:.0f} minutes after its presenter's page "
                    "was closed; try again later, or ask whoever runs this server."
                )
            code = "".join(secrets.choice(ALPHABET) for _ in range(CODE_LEN))
            while self.store.get("classes", code) is not None or self.store.get("ended", code) is not None:
                code = "".join(secrets.choice(ALPHABET) for _ in range(CODE_LEN))
            c = LiveClass(code, owner, now, now)
            self._save(c)
            self.store.put("owners", owner, code.encode())
            return c

    def _of(self, owner: str) -> LiveClass | None:
        code = self.store.get("owners", owner)
        c = self._load(code.decode()) if code else None
        return c if c is not None and c.owner == owner else None

    def of_owner(self, owner: str) -> LiveClass | None:
        """The class this browser presents, if any (one read or two: every visitor's run asks)."""
        now = self._clock()
        self._expire(now)
        c = self._of(owner)
        if c is not None and now - c.last_active > self.idle_s:
            self._expire(now, force=True)
            return None
        return c

    def beat(self, code: str, owner: str) -> bool:
        """The presenter's heartbeat (an open tab, whether or not anyone clicks): the class stays. False when it is
        not this owner's or has ended."""
        with self.store.lock("classes"):
            c = self._load(code)
            if c is None or c.owner != owner:
                return False
            c.last_active = self._clock()
            self._save(c)
            return True

    def publish(self, code: str, owner: str, slug: str, state: dict[str, Any]) -> View:
        """The presenter's current view (a new number only when it changed). Only the owner publishes; a key that
        starts with "_" (a session's private state) is never published."""
        state = {k: v for k, v in state.items() if isinstance(k, str) and not k.startswith("_")}
        with self.store.lock("classes"):
            c = self._mine(code, owner)
            now = c.last_active = self._clock()
            changed = c.view is None or c.view.slug != slug or c.view.state != state
            if changed:
                c.view = View((c.view.number + 1) if c.view else 1, slug, dict(state), now)
            self._save(c, changed=changed)
            return c.view

    def end(self, code: str, owner: str) -> None:
        with self.store.lock("classes"):
            c = self._load(code)
            if c is not None and c.owner == owner:
                self._close(code, "ended: the presenter closed it")

    def close(self, code: str, why: str = "ended: the server's operator closed it") -> None:
        """The operator ends a class (the operator page); its followers are told `why`."""
        with self.store.lock("classes"):
            self._close(code, why)

    def hand(self, code: str, owner: str, view_id: str) -> int:
        """The presenter hands the class a frozen copy of their results (a RunStore view id, as "Share this view"
        makes); followers take it once. Only the owner hands; returns the hand-over's number."""
        with self.store.lock("classes"):
            c = self._mine(code, owner)
            c.last_active = self._clock()
            c.handed = ((c.handed[0] + 1) if c.handed else 1, view_id)
            self._save(c, changed=True)
            return c.handed[0]

    def ask(self, code: str, owner: str, prompt: str, options: list[str], choices_only: bool = False) -> Question:
        """The presenter opens a question (replacing the last one); with `choices_only`, only the offered options
        are taken as answers (no typed words reach the projected chart)."""
        with self.store.lock("classes"):
            c = self._mine(code, owner)
            c.last_active = self._clock()
            c.question = Question((c.question.number + 1) if c.question else 1, prompt, list(options), bool(choices_only))
            c._answered.clear()
            self._save(c, changed=True)
            return c.question

    def hide(self, code: str, owner: str, answers: set[str] | list[str]) -> Question:
        """The presenter's choice of answers kept off the chart (the class's guesses as typed); only the owner."""
        with self.store.lock("classes"):
            c = self._mine(code, owner, "This live class is not yours, or it asks nothing.")
            if c.question is None:
                raise Ended("This live class is not yours, or it asks nothing.")
            c.last_active = self._clock()
            c.question.hidden = {str(a) for a in answers}
            self._save(c)
            return c.question

    def reveal(self, code: str, owner: str, answer: str) -> Question:
        with self.store.lock("classes"):
            c = self._mine(code, owner, "This live class is not yours, or it asks nothing.")
            if c.question is None:
                raise Ended("This live class is not yours, or it asks nothing.")
            c.last_active = self._clock()
            c.question.revealed, c.question.answer = True, answer
            self._save(c, changed=True)
            return c.question

    # -- the followers ----------------------------------------------------------------------------------------------
    def peek(self, code: str) -> LiveClass | None:
        """The class's record as it is now (None: no running class), reading nothing else and writing nothing: what a
        process's watcher compares to learn whether its followers have something new (views.live_wake)."""
        return self._load(code)

    def follow(self, code: str, follower: str) -> View | None:
        """A follower's heartbeat: the current view (None before the presenter showed one). Ended when the code names
        no running class: why it ended to a follower who was in it, no_class(code) to anyone else. One read of the
        class; its heartbeat written at most every BEAT_WRITE_S (so a class of 300 beating every 4 s writes ~75 a s)."""
        now = self._clock()
        self._expire(now)
        c = self._load(code) if is_code(code) else None
        if c is not None and now - c.last_active > self.idle_s:
            self._expire(now, force=True)
            c = None
        if c is None:
            why = self.store.get("ended", code) if is_code(code) else None
            if why is not None and self.store.get("seen:" + code, follower) is not None:
                raise Ended(f"The live class {code} has {why.decode()}.", member=True)
            raise Ended(no_class(str(code)))
        with self._mu:
            last = self._beats.get((code, follower))
        if last is None or now - last >= BEAT_WRITE_S or now < last:
            self._beat_write(code, follower, now)
        return c.view

    def _beat_write(self, code: str, follower: str, now: float, **fields) -> None:
        with self.store.lock("seen:" + code):
            raw = self.store.get("seen:" + code, follower)
            e = json.loads(raw) if raw else {}
            e["t"] = now
            e.update(fields)
            self.store.put("seen:" + code, follower, json.dumps(e).encode(), ttl_s=ENDED_KEEP_S)
        with self._mu:
            self._beats[(code, follower)] = now
            self._beats.move_to_end((code, follower))
            while len(self._beats) > 8192:
                self._beats.popitem(last=False)

    def shown(self, code: str, follower: str, number: int) -> float | None:
        """A follower's page finished drawing view `number` on the server: the seconds since the presenter published
        it (None for a view that is no longer current, or a class that is gone)."""
        c = self._load(code)
        if c is None or c.view is None or c.view.number != number:
            return None
        raw = self.store.get("seen:" + code, follower)
        if raw is not None and json.loads(raw).get("n") == number:
            return None
        now = self._clock()
        delay = now - c.view.at
        self._beat_write(code, follower, now, n=number, d=delay)
        return delay

    def caught_up(self, code: str) -> tuple[int, int, float | None]:
        """(followers now, how many of them show the current view, the slowest of those in seconds)."""
        c = self._load(code)
        if c is None:
            return 0, 0, None
        now = self._clock()
        n = c.view.number if c.view else None
        seen = self._seen(code)
        live = [e for e in seen.values() if now - e["t"] <= SEEN_S]
        done = sum(1 for e in live if n is not None and e.get("n") == n)
        delays = [e["d"] for e in seen.values() if n is not None and e.get("n") == n and "d" in e]
        return len(live), done, (max(delays) if delays else None)

    def leave(self, code: str, follower: str) -> None:
        """A follower who explores on their own: not counted from now (still told if the class ends)."""
        if not is_code(code):
            return
        with self.store.lock("seen:" + code):
            raw = self.store.get("seen:" + code, follower)
            if raw is not None:
                e = json.loads(raw)
                e["t"] = -1e18
                self.store.put("seen:" + code, follower, json.dumps(e).encode(), ttl_s=ENDED_KEEP_S)
        with self._mu:
            self._beats.pop((code, follower), None)

    def followers(self, code: str) -> int:
        """How many follow right now (a heartbeat within SEEN_S seconds)."""
        if self._load(code) is None:
            return 0
        now = self._clock()
        return sum(1 for e in self._seen(code).values() if now - e["t"] <= SEEN_S)

    def handed(self, code: str) -> tuple[int, str] | None:
        c = self._load(code)
        return c.handed if c is not None else None

    def question(self, code: str) -> Question | None:
        c = self._load(code)
        return c.question if c is not None else None

    def answer(self, code: str, browser: str, text: str) -> str:
        """A follower's guess (one per browser: a new one replaces it). Returns what was kept; ValueError with a
        message for an empty or long answer, a closed question, or answers faster than one every 2 seconds."""
        text = " ".join(str(text).split())
        if not text:
            raise ValueError("Type a word (or pick one) first.")
        if len(text) > MAX_ANSWER_CHARS:
            raise ValueError(f"An answer is at most {MAX_ANSWER_CHARS} characters.")
        with self.store.lock("classes"):
            c = self._load(code)
            q = c.question if c is not None else None
            if q is None or q.revealed:
                raise ValueError("The question is closed: the model's answer is on the board.")
            if q.choices_only and text not in q.options:
                raise ValueError("This question takes one of the offered choices only: pick one from the list.")
            now = self._clock()
            if now - c._answered.get(browser, -1e18) < MIN_ANSWER_GAP_S:
                raise ValueError("One answer every 2 seconds: try again in a moment.")
            c._answered[browser] = now
            q.answers[browser] = text
            self._save(c)
            return text

    # -- the operator -----------------------------------------------------------------------------------------------
    def running(self) -> list[dict]:
        """The running classes, for the operator page: code, minutes since it started, seconds since its presenter
        was last seen, followers now, the page shown, whether a question is open. Never the owner's browser id."""
        now = self._clock()
        self._expire(now, force=True)
        return [
            {
                "code": c.code,
                "started, min ago": round((now - c.started) / 60, 1),
                "presenter seen, s ago": round(now - c.last_active),
                "following": sum(1 for e in self._seen(c.code).values() if now - e["t"] <= SEEN_S),
                "page": (c.view.slug or "overview") if c.view else "",
                "question": "open" if c.question and not c.question.revealed else ("revealed" if c.question else ""),
            }
            for c in sorted(self._all(), key=lambda c: c.started)
        ]

    def __len__(self) -> int:
        return len(self.store.items("classes"))
