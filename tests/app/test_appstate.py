"""The app's state without Streamlit: loaders, the trace cache, a page's last run, check results."""

import gc
import threading

import pytest

import appstate
from pipeline.model import ModelLoadError

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


def test_check_results_are_computed_once_for_every_session_and_a_failure_is_retried():
    import threading
    import time

    store, tr, calls = appstate.CheckResults(), FakeTrace(1), []

    def slow():  # a check that re-runs the model: the other sessions asking meanwhile wait for its result
        calls.append(1)
        time.sleep(0.2)
        return ["ok"]

    got = []
    threads = [threading.Thread(target=lambda: got.append(store.compute("attn0-0", tr, slow))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [["ok"]] * 8 and len(calls) == 1
    assert store.compute("attn0-1", tr, lambda: ["other head"]) == ["other head"]  # another key: its own results

    def broken():
        raise RuntimeError("the check failed")

    with pytest.raises(RuntimeError):
        store.compute("layer", tr, broken)
    assert store.compute("layer", tr, lambda: ["second try"]) == ["second try"]
    assert not store._running, "no computation left registered"


@pytest.mark.parametrize("slot", ["gen", "kv"])
def test_recall_of_a_missing_slot_is_none(slot):
    assert appstate.recall({}, slot, "smol") is None


def test_shared_texts_short_ids_stable_and_bounded_per_browser():
    from appstate import SharedTexts

    s = SharedTexts(budget_chars=100, per_browser=25, per_address=100)
    a = s.put("x" * 10, "b1")
    assert a == SharedTexts.id_of("x" * 10) and len(a) == 12 and s.get(a) == "x" * 10
    assert s.put("x" * 10, "b1") == a  # the same text, the same id
    b = s.put("y" * 10, "b1")
    c = s.put("z" * 10, "b1")  # over this browser's 25 characters: its own oldest goes
    assert s.get(a) is None and s.get(b) == "y" * 10 and s.get(c) == "z" * 10
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


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_a_flood_of_cookieless_visits_never_evicts_a_browsers_runs():
    """130 cookie-less visits (each a new browser with no runs, as /operator gets) from the teacher's own address."""
    from appstate import RunStore, recall, remember

    store = RunStore(max_sessions=128, per_address=128)
    teacher: dict = {}
    store.attach(teacher, "t" * 16, lambda: "x")
    remember(teacher, "gen", "smol", "the answer")
    store.attach(teacher, "t" * 16, lambda: "x")
    for i in range(400):
        store.attach({}, None, lambda i=i: f"{i:016x}")
    back: dict = {}
    store.attach(back, "t" * 16, lambda: "y")
    assert recall(back, "gen", "smol") == "the answer"


def test_runs_of_other_browsers_are_kept_for_the_promised_time_then_make_room():
    from appstate import RunStore, recall, remember

    clock = Clock()
    store = RunStore(max_sessions=3, per_address=3, clock=clock)
    for b in ("a", "b", "c"):
        st: dict = {}
        store.attach(st, b * 16, lambda: "?", address=f"10.0.0.{ord(b)}")
        remember(st, "gen", "m", b)
        store.save(st, address=f"10.0.0.{ord(b)}")  # what the app does at the end of every run
    stranger: dict = {}
    store.attach(stranger, "d" * 16, lambda: "?", address="10.9.9.9")
    remember(stranger, "gen", "m", "d")
    store.save(stranger, address="10.9.9.9")
    assert all(store.sessions.get(b * 16) for b in "abc")  # the store was full of others' runs: d's last as long as its tab
    clock.t += RunStore.KEEP_RUNS_S + 1
    later: dict = {}
    store.attach(later, "e" * 16, lambda: "?", address="10.9.9.9")
    remember(later, "gen", "m", "e")
    store.save(later, address="10.9.9.9")
    assert store.sessions.get("a" * 16) is None and recall(later, "gen", "m") == "e"  # the oldest, past its time, made room


def test_a_flood_of_frozen_views_never_breaks_a_teachers_link():
    """260 clicks on "Add a copy of my results" from other browsers, on the teacher's address and on another."""
    from appstate import Full, RunStore, remember

    store = RunStore(max_frozen=200, views_per_browser=16, views_per_address=64)
    teacher: dict = {}
    store.attach(teacher, "t" * 16, lambda: "?")
    remember(teacher, "gen", "smol", "lesson")
    vid = store.freeze(teacher, lambda: "abcdefabcdef")
    refused = 0
    for address in ("local", "10.1.1.1"):
        for i in range(260):
            st: dict = {}
            store.attach(st, None, lambda i=i: f"{i:016x}", address)
            remember(st, "gen", "smol", "spam")
            try:
                store.freeze(st, lambda i=i, a=address: f"{hash((a, i)) & 0xFFFFFFFFFFFF:012x}", address)
            except Full:
                refused += 1
    mine: dict = {}
    assert store.thaw(mine, vid) and mine["_runs"]["gen"][1] == "lesson"
    assert refused >= 2 * (260 - 64)


def test_a_browser_replaces_only_its_own_oldest_view():
    from appstate import RunStore, remember

    store = RunStore(views_per_browser=2)
    st: dict = {}
    store.attach(st, "t" * 16, lambda: "?")
    remember(st, "gen", "m", "x")
    ids = iter(["000000000001", "000000000002", "000000000003"])
    got = [store.freeze(st, lambda: next(ids)) for _ in range(3)]
    assert [store.views.get(v) is not None for v in got] == [False, True, True]


def test_long_prompts_from_a_flood_never_break_a_link():
    """105 sessions with 200k-character prompts from one address (each a new browser) against a teacher's ?p= link."""
    from appstate import Full, SharedTexts

    s = SharedTexts()
    pid = s.put("teacher's long prompt " * 5000, "t" * 16, "local")
    refused = 0
    for i in range(105):
        try:
            s.put(f"{i} " + "a" * 200_000, f"{i:016x}", "local")
        except Full:
            refused += 1
    assert s.get(pid) == "teacher's long prompt " * 5000 and refused > 0


def test_a_frozen_view_is_a_copy_both_ways():
    """A link with a copy of one's results: its opener gets a copy under their own id; their runs and a Stop
    pressed on the copy never reach the owner; a run still going is not frozen."""
    from appstate import RunStore, recall, remember
    from pipeline.forward.sampling import GREEDY
    from pipeline.generation import GenerationRecord

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


class Sized:
    def __init__(self, key, nbytes):
        self.key, self.label, self.footprint_bytes = key, f"model {key}", nbytes


def test_loaders_are_bounded_by_bytes_and_say_what_they_unloaded():
    loaders = appstate.Loaders(max_models=8, load=lambda k, progress=None: Sized(k, 600), max_bytes=1000)
    for k in ("/m/a", "/m/b", "/m/c"):
        assert loaders.get(k).wait(5)
    assert loaders.keys() == ["/m/c"] and loaders.nbytes() == 600
    ev = list(loaders.evictions)
    assert [(e.key, e.for_key, e.why, e.nbytes) for e in ev] == [("/m/a", "/m/b", "bytes", 600), ("/m/b", "/m/c", "bytes", 600)]
    assert ev[0].label == "model /m/a"


def test_models_root_refuses_everything_outside_it_the_same_way(tmp_path):
    root = tmp_path / "models"
    (root / "m").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (root / "escape").symlink_to(tmp_path / "outside")
    roots = [root.resolve()]
    assert appstate.folder_refusal(str(root / "m"), roots) is None
    assert appstate.folder_refusal(str(root / "missing"), roots) is None  # under the root: check_folder says why
    msgs = {appstate.folder_refusal(p, roots) for p in ("/etc/passwd", "/root/.ssh", "/no/such", str(root / "escape"), str(root / "m/../../outside"))}
    assert len(msgs) == 1 and "only under" in msgs.pop()
