"""Demo mode's policy without Streamlit: the switch, the allowlist, caps, the rate limit, the fair line, the
error log; the model's first-come-first-served lock; the cache check; the command line's bad input."""

import io
import logging
import threading
import time

import pytest

import pipeline
from hosting import demo
from pipeline.model import FairLock, ModelLoadError, cache_ok, check_weights

pytestmark = pytest.mark.unit


def test_off_by_default_and_nothing_capped():
    p = demo.load_policy({}, {})
    assert not p.enabled and p.caps == demo.UNCAPPED and p.allows_model("/any/folder")


def test_switched_on_by_the_environment_or_the_secrets_section():
    p = demo.load_policy({}, {"LLM_EXPLORER_DEMO": "1"})
    assert p.enabled and p.models == (pipeline.EMBEDDED,) and p.caps == demo.Caps()
    assert not p.allows_model("/etc") and p.allows_model(pipeline.EMBEDDED)
    s = demo.load_policy({"demo": {"enabled": True, "models": [pipeline.GEMMA], "new_tokens": "64", "operator_password": "pw"}}, {})
    assert s.enabled and s.models == (pipeline.GEMMA,) and s.caps.new_tokens == 64 and s.operator_password == "pw"
    assert demo.load_policy({}, {"LLM_EXPLORER_DEMO": "yes", "LLM_EXPLORER_MODELS": f"{pipeline.EMBEDDED}, {pipeline.GEMMA}"}).models == (
        pipeline.EMBEDDED,
        pipeline.GEMMA,
    )
    assert not demo.load_policy({}, {"LLM_EXPLORER_DEMO": "0"}).enabled


def test_rate_limit_per_session_over_a_sliding_minute():
    now = [0.0]
    rl = demo.RateLimiter(3, clock=lambda: now[0])
    assert [rl.allow("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = rl.allow("a")
    assert 59 < wait <= 60
    assert rl.allow("b") == 0.0  # another visitor is not affected
    now[0] = 60.5
    assert rl.allow("a") == 0.0
    assert demo.RateLimiter(0).allow("a") == 0.0  # 0: no limit


def test_an_hourly_limit_is_the_same_limiter_over_an_hour():
    now = [0.0]
    rl = demo.RateLimiter(5, clock=lambda: now[0], window_s=3600.0)
    assert [rl.allow("address") for _ in range(5)] == [0.0] * 5
    now[0] = 600.0
    assert rl.wait("address") == pytest.approx(3000.0) and rl.allow("address") == pytest.approx(3000.0)
    now[0] = 3600.5
    assert rl.wait("address") == 0.0 and rl.allow("address") == 0.0
    assert demo.Caps().classes_per_hour == 5 and demo.UNCAPPED.classes_per_hour is None


def test_the_fair_line_serves_one_at_a_time_one_place_per_visitor_and_says_where_each_stands():
    line = demo.FairQueue(at_once=1)
    order, positions = [], {}
    first_in = threading.Event()
    release = threading.Event()

    def hold():
        with line.turn("alice", "sweep"):
            first_in.set()
            release.wait(5)
            order.append("alice")

    def wait_turn(who):
        with line.turn(who, "kernels", on_wait=lambda pos: positions.setdefault(who, pos), poll_s=0.02):
            order.append(who)

    t0 = threading.Thread(target=hold)
    t0.start()
    assert first_in.wait(5)
    t1 = threading.Thread(target=wait_turn, args=("bob",))
    t1.start()
    time.sleep(0.1)
    t2 = threading.Thread(target=wait_turn, args=("carol",))
    t2.start()
    time.sleep(0.2)
    with pytest.raises(demo.Busy):  # alice already holds a place
        with line.turn("alice", "again"):
            pass
    snap = line.snapshot()
    assert [w for w, _ in snap["running"]] == ["sweep"] and len(snap["waiting"]) == 2
    release.set()
    for t in (t0, t1, t2):
        t.join(5)
    assert order == ["alice", "bob", "carol"] and positions == {"bob": 1, "carol": 2}
    assert line.snapshot() == {"running": [], "waiting": [], "served": 3}


def test_a_visitor_who_leaves_the_line_frees_their_place():
    line = demo.FairQueue(at_once=1)
    gone = RuntimeError("tab closed")

    def leave(pos):
        raise gone

    with line.turn("alice", "sweep"):
        with pytest.raises(RuntimeError):
            with line.turn("bob", "kernels", on_wait=leave, poll_s=0.01):
                pass
        assert line.snapshot()["waiting"] == []
    with line.turn("bob", "kernels"):  # bob may queue again
        pass


def test_errors_are_logged_with_a_request_id_and_the_visitor_sees_only_the_id(caplog):
    log = demo.ErrorLog(keep=2)
    with caplog.at_level(logging.ERROR, logger="llm_explorer"):
        try:
            raise FileNotFoundError("/home/teacher/secret/model.safetensors")
        except FileNotFoundError as e:
            rid = log.record(e, "load the model")
    assert len(rid) == 8 and rid in caplog.text and "Traceback" in caplog.text and "/home/teacher" in caplog.text
    assert log.items[-1][1] == rid
    for _ in range(3):
        log.record(ValueError("x"), "y")
    assert len(log.items) == 2


def test_sessions_counts_browsers_seen_recently():
    now = [0.0]
    s = demo.Sessions(clock=lambda: now[0])
    s.seen("a")
    s.seen("b")
    now[0] = 200.0
    s.seen("a")
    assert s.active(300) == 2 and s.active(100) == 1


def test_the_model_lock_goes_to_the_longest_waiter():
    lock = FairLock()
    got = []
    lock.acquire()
    threads = [threading.Thread(target=lambda i=i: (lock.acquire(), got.append(i), lock.release())) for i in range(4)]
    for t in threads:
        t.start()
        time.sleep(0.05)  # they queue in order
    lock.release()
    for t in threads:
        t.join(5)
    assert got == [0, 1, 2, 3] and not lock.locked()
    assert lock.acquire(blocking=False) and not FairLock().locked()
    res = []
    t = threading.Thread(target=lambda: res.append(lock.acquire(timeout=0.05)))
    t.start()
    t.join(5)
    assert res == [False]  # timed out, and left the line
    lock.release()
    assert not lock.locked()
    with pytest.raises(RuntimeError):
        lock.release()


def test_a_truncated_safetensors_file_is_caught_before_loading(tmp_path):
    import torch
    from safetensors.torch import save_file

    folder = tmp_path / "m"
    folder.mkdir()
    save_file({"w": torch.zeros(64, 64)}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text("{}")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) - 100])
    with pytest.raises(ModelLoadError, match="truncated"):
        check_weights(folder)
    assert not cache_ok(folder)


def test_a_cache_without_its_finished_marker_is_not_used(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert not cache_ok(tmp_path)


@pytest.mark.parametrize("bad", ["caf\udce9", "lone \ud800 surrogate"])
def test_the_command_line_refuses_text_that_is_not_utf8(bad, capsys):
    from pipeline.__main__ import main

    out = io.StringIO()
    assert main(["tokens", bad], out=out) == 2
    assert "not valid UTF-8" in capsys.readouterr().err and out.getvalue() == ""


def test_secrets_file_reads_the_demo_section(tmp_path):
    (tmp_path / ".streamlit").mkdir()
    (tmp_path / ".streamlit" / "secrets.toml").write_text('[demo]\nenabled = true\nmodels = ["x"]\n')
    assert demo.secrets_file(str(tmp_path)) == {"demo": {"enabled": True, "models": ["x"]}}
    assert demo.secrets_file(str(tmp_path / "none")) == {}


def test_operator_password_is_throttled_then_locked_per_address_and_logged_without_the_guess(caplog):
    now = [1000.0]
    g = demo.PasswordGuard(max_failures=3, window_s=600, lockout_s=900, throttle_s=2, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="llm_explorer"):
        assert g.wait("10.0.0.66") == 0 and not g.attempt(False, "10.0.0.66")
        assert g.wait("10.0.0.66") == 2 and not g.attempt(True, "10.0.0.66")  # throttled: even the right password waits its turn
        now[0] += 2
        assert not g.attempt(False, "10.0.0.66") and g.wait("10.0.0.66") == 4  # the wait doubles with each failure in the window
        now[0] += 4
        assert not g.attempt(False, "10.0.0.66") and g.locked("10.0.0.66")  # the third: that address is locked
        assert not g.locked("10.0.0.1") and g.wait("10.0.0.1") == 0 and g.attempt(True, "10.0.0.1")  # the operator elsewhere is not
        now[0] += 899
        assert g.locked("10.0.0.66") and not g.attempt(True, "10.0.0.66") and 0 < g.wait("10.0.0.66") <= 1
        now[0] += 2
        assert not g.locked("10.0.0.66") and g.attempt(True, "10.0.0.66")
    failures = [r.getMessage() for r in caplog.records if "wrong password" in r.getMessage()]
    assert len(failures) == 3 and "locked" in failures[-1] and all(time.strftime("%Y-%m-%d", time.localtime(1000)) in m for m in failures)
    assert all("10.0.0.66" in m for m in failures)


def test_a_rate_limiter_can_be_asked_without_spending():
    now = [0.0]
    r = demo.RateLimiter(2, clock=lambda: now[0])
    assert r.wait("b") == 0 and r.wait("b") == 0  # asking records nothing
    assert r.allow("b") == 0 and r.allow("b") == 0 and r.wait("b") == 60.0
    now[0] += 61
    assert r.wait("b") == 0


def test_one_address_may_hold_a_bounded_number_of_runs_whatever_its_sessions():
    slots = demo.AddressSlots()
    with slots.hold("10.0.0.1", 2), slots.hold("10.0.0.1", 2):
        with pytest.raises(demo.Busy, match="network address already has 2 runs"):
            with slots.hold("10.0.0.1", 2):
                pass
        with slots.hold("10.0.0.2", 2):  # another address is not affected
            assert slots.count("10.0.0.2") == 1
    assert slots.count("10.0.0.1") == 0
    with slots.hold("x", 0), slots.hold("x", 0), slots.hold("x", 0):  # 0: no limit (outside demo mode)
        pass


def test_the_demo_caps_bound_addresses_and_page_one():
    c = demo.Caps()
    assert c.address_at_once >= 30 and c.address_per_minute >= 30 * 10 and 0 < c.tokenize_chars <= 50_000
    assert demo.load_policy({"demo": {"enabled": True, "address_at_once": "5"}}, {}).caps.address_at_once == 5


def _fake_cache(folder):
    """A finished conversion of a tiny model: config, weights, tokenizer files and the digest record."""
    import json

    import torch
    from safetensors.torch import save_file

    from pipeline.model.store import CACHE_DONE, _digests

    folder.mkdir()
    save_file({"w": torch.arange(4096.0).reshape(64, 64)}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text("{}")
    (folder / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0, "b": 1}}}')
    (folder / CACHE_DONE).write_text(json.dumps({"files": _digests(folder)}))


@pytest.mark.parametrize("damage", ["cut tokenizer", "cut weights", "same-size random weights", "deleted file", "old marker"])
def test_the_cache_digest_catches_every_damage(tmp_path, damage):
    import os

    from pipeline.model import CACHE_DONE, cache_problem

    folder = tmp_path / "c"
    _fake_cache(folder)
    assert cache_problem(folder) is None
    w, t = folder / "model.safetensors", folder / "tokenizer.json"
    if damage == "cut tokenizer":
        t.write_bytes(t.read_bytes()[:10])
    elif damage == "cut weights":
        w.write_bytes(w.read_bytes()[:-100])
    elif damage == "same-size random weights":
        w.write_bytes(os.urandom(w.stat().st_size))
    elif damage == "deleted file":
        t.unlink()
    else:
        (folder / CACHE_DONE).write_text('{"gguf": "x", "size": 1}')  # made before digests were recorded
    assert cache_problem(folder) is not None
    tokenizer_only = cache_problem(folder, ("tokenizer.json",))  # what loading the tokenizer alone checks
    assert (tokenizer_only is None) == (damage in ("cut weights", "same-size random weights"))
