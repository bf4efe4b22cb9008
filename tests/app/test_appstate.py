"""The app's state without Streamlit: loaders, the trace cache, a page's last run, check results."""

import gc
import threading

import pytest

import appstate
from pipeline.models import ModelLoadError

pytestmark = pytest.mark.unit


class FakeModel:
    def __init__(self, key):
        self.key = key


def fake_load(key, progress=None):
    if progress:
        progress(0.5, "half")
    if "broken" in key:
        raise ModelLoadError(f"{key} is broken")
    return FakeModel(key)


def test_a_failed_load_forgets_only_itself(tmp_path):
    loaders = appstate.Loaders(max_models=4, load=fake_load)
    good = loaders.get("smollm2-135m-instruct")
    assert good.wait(5) and good.result.key == "smollm2-135m-instruct"
    bad = loaders.get(str(tmp_path / "broken"))
    assert bad.wait(5) and "broken" in bad.error and bad.result is None
    loaders.forget(str(tmp_path / "broken"))
    assert loaders.keys() == ["smollm2-135m-instruct"]
    assert loaders.get("smollm2-135m-instruct") is good  # still loaded, not reloaded


def test_one_folder_typed_four_ways_is_one_loader(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "m")
    loaders = appstate.Loaders(max_models=4, load=fake_load)
    got = {id(loaders.get(p)) for p in (str(tmp_path / "m"), f"{tmp_path}/m/", f"{tmp_path}/m//", str(tmp_path / "link"))}
    assert len(got) == 1 and len(loaders.keys()) == 1


def test_loaders_keep_at_most_max_models_least_recent_out():
    loaders = appstate.Loaders(max_models=2, load=fake_load)
    for k in ("smollm2-135m-instruct", "gemma3-270m"):
        loaders.get(k).wait(5)
    loaders.get("smollm2-135m-instruct")  # used again: the newest
    loaders.get("/tmp/third").wait(5)
    assert loaders.keys() == ["smollm2-135m-instruct", "/tmp/third"]


def test_loader_reports_progress_and_unexpected_errors():
    def boom(key, progress=None):
        progress(0.25, "reading")
        raise RuntimeError("disk on fire")

    ldr = appstate.Loader("x", boom)
    assert ldr.wait(5) and ldr.error == "RuntimeError: disk on fire" and ldr.fraction == 0.25


class FakeTrace:
    def __init__(self, nbytes):
        self.nbytes = nbytes


def test_trace_cache_is_bounded_by_bytes_and_keeps_the_newest():
    cache = appstate.TraceCache(budget=100)
    made = []

    def make(n):
        def f():
            made.append(n)
            return FakeTrace(n)

        return f

    a = cache.get("a", make(40))
    assert cache.get("a", make(999)) is a and made == [40]  # a hit makes nothing
    cache.get("b", make(40))
    cache.get("a", make(1))  # a is now the most recent
    cache.get("c", make(40))  # 120 > 100: b (least recent) goes
    assert list(cache.items) == ["a", "c"] and cache.nbytes == 80
    cache.get("huge", make(500))  # alone over budget: still kept
    assert list(cache.items) == ["huge"]


def test_trace_cache_makes_outside_the_lock():
    cache = appstate.TraceCache(budget=10**9)
    inside = threading.Event()
    release = threading.Event()

    def slow():
        inside.set()
        release.wait(5)
        return FakeTrace(1)

    t = threading.Thread(target=lambda: cache.get("slow", slow))
    t.start()
    assert inside.wait(5)
    assert cache.get("fast", lambda: FakeTrace(1)).nbytes == 1  # not blocked by the slow one
    release.set()
    t.join(5)
    assert set(cache.items) == {"slow", "fast"}


def test_remember_recall_is_per_model_and_one_per_slot():
    state = {}
    appstate.remember(state, "sweep", "smol", [1])
    assert appstate.recall(state, "sweep", "smol") == [1]
    assert appstate.recall(state, "sweep", "gemma") is None  # another model's run is not shown
    appstate.remember(state, "sweep", "gemma", [2])  # replaces: one per slot, memory bounded
    assert appstate.recall(state, "sweep", "smol") is None and appstate.recall(state, "sweep", "gemma") == [2]
    appstate.forget_run(state, "sweep")
    assert appstate.recall(state, "sweep", "gemma") is None


def test_check_results_never_keep_their_trace_alive():
    store = appstate.CheckResults(max_items=2)
    tr = FakeTrace(1)
    store.put("overview", tr, ["ok"])
    assert store.get("overview", tr) == ["ok"]
    assert store.get("overview", FakeTrace(1)) is None  # another trace: not its results
    del tr
    gc.collect()
    assert store.get("overview", None) is None  # the trace is gone, so are its results
    keep = [FakeTrace(1) for _ in range(3)]
    for i, t in enumerate(keep):
        store.put(f"k{i}", t, i)
    assert store.get("k0", keep[0]) is None and store.get("k2", keep[2]) == 2  # bounded


@pytest.mark.parametrize("slot", ["gen", "kv"])
def test_recall_of_a_missing_slot_is_none(slot):
    assert appstate.recall({}, slot, "smol") is None


def test_shared_texts_short_ids_stable_and_bounded():
    from appstate import SharedTexts

    s = SharedTexts(budget_chars=25)
    a = s.put("x" * 10)
    assert a == SharedTexts.id_of("x" * 10) and len(a) == 12 and s.get(a) == "x" * 10
    assert s.put("x" * 10) == a  # the same text, the same id
    b = s.put("y" * 10)
    s.get(a)  # a used most recently: b goes first
    c = s.put("z" * 10)
    assert s.get(b) is None and s.get(a) == "x" * 10 and s.get(c) == "z" * 10
    assert s.get("nope") is None


def test_run_store_keeps_runs_per_browser_and_restores_a_copy_after_a_refresh():
    from appstate import RunStore, recall, remember

    store, ids = RunStore(max_sessions=2), iter(["a", "b", "c", "d"])
    first: dict = {}  # a browser's first visit: no cookie yet, a new id (which the app then sets as its cookie)
    sid = store.attach(first, None, lambda: next(ids))
    remember(first, "gen", "smol", "answer")
    refreshed: dict = {}  # the same browser after a refresh: a new session that sends its cookie back
    assert store.attach(refreshed, sid, lambda: next(ids)) == "a"
    assert recall(refreshed, "gen", "smol") == "answer" and refreshed["_runs"] is not first["_runs"]  # a copy
    other: dict = {}  # another browser (its own cookie, or none): never the first one's runs
    assert store.attach(other, None, lambda: next(ids)) == "b" and recall(other, "gen", "smol") is None
    remember(other, "gen", "smol", "theirs")
    again: dict = {}
    store.attach(again, "a", lambda: next(ids))
    assert recall(again, "gen", "smol") == "answer"  # what the other browser did never reached the first one's runs
    store.attach({}, None, lambda: next(ids))  # more browsers than kept: the oldest is dropped
    store.attach({}, None, lambda: next(ids))
    late: dict = {}
    assert store.attach(late, "b", lambda: "e") == "b" and recall(late, "gen", "smol") is None


def test_a_frozen_view_is_a_copy_both_ways():
    """A link with a copy of one's results: its opener gets a copy under their own id; their runs and a Stop
    pressed on the copy never reach the owner; a run still going is not frozen."""
    from appstate import RunStore, recall, remember
    from pipeline.generation import GenerationRecord
    from pipeline.sampling import GREEDY

    store = RunStore()
    owner: dict = {}
    store.attach(owner, "0" * 16, lambda: "x")
    done = GenerationRecord(prompt="p", chat=False, model="m", max_new_tokens=4, sampling=GREEDY, prompt_tokens=1)
    done.done = True
    running = GenerationRecord(prompt="q", chat=False, model="m", max_new_tokens=4, sampling=GREEDY, prompt_tokens=1)
    remember(owner, "gen", "smol", done)
    remember(owner, "hw", "smol", running)
    vid = store.freeze(owner, lambda: "abcdefabcdef")
    visitor: dict = {}
    assert store.attach(visitor, "1" * 16, lambda: "y") == "1" * 16
    assert store.thaw(visitor, vid) and not store.thaw(visitor, "000000000000")
    copy = recall(visitor, "gen", "smol")
    assert copy is not done and copy.prompt == "p" and recall(visitor, "hw", "smol") is None
    copy.stopped = True
    remember(visitor, "gen", "smol", "theirs")
    assert recall(owner, "gen", "smol") is done and not done.stopped


def test_lru_says_before_the_work_whether_it_will_be_made():
    from appstate import LRU

    c, made = LRU(2), []
    assert "a" not in c
    for k in "aba":
        c.get(k, lambda k=k: made.append(k) or k.upper())
    assert made == ["a", "b"] and "a" in c
    c.get("c", lambda: "C")  # b is the least recently used: out
    assert "b" not in c and len(c) == 2
