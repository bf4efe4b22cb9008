"""The scheduler without a model: admission, the KV budget in blocks, the queue bound, cancel, finish, and the
request's life moved by the engine's reports (`update`) alone."""

import itertools
import threading

import pytest

from pipeline.engine.blocks import BlockPool
from pipeline.engine.request import Chunk, PassOutput, Plan, Policy, QueueFull, Request, State, TooLarge
from pipeline.engine.scheduler import Scheduler
from pipeline.generation.events import Finish

pytestmark = pytest.mark.unit


def req(prompt=10, new=6, name=""):
    """A request whose prompt shares no block with another's (the prefix cache would serve it otherwise)."""
    start = next(_starts)
    return Request(list(range(start, start + prompt)), new, name=name)


_starts = itertools.count(1, 1000)


def done(s, r, upto):
    """The engine's report of a pass that wrote r's prompt into the cache up to token `upto`."""
    s.update(Plan([Chunk(r, r.prefilled, upto)], [], []), PassOutput(prefilled={r.id: upto}))


def test_blocks_cover_prompt_and_new_tokens_and_come_back():
    pool = BlockPool(10, 4)
    assert pool.blocks_for(16) == 4 and pool.blocks_for(17) == 5 and pool.blocks_for(1) == 1
    got = pool.take(3)
    assert len(set(got)) == 3 and pool.n_free == 7
    pool.give_back(got)
    assert pool.n_free == 10
    with pytest.raises(RuntimeError):
        pool.take(11)


def test_admission_respects_the_kv_budget_first_come_first_served():
    s = Scheduler(BlockPool(8, 4), max_batch=8)
    a, b, c = req(10, 6), req(10, 6), req(2, 2)  # 4 blocks, 4 blocks, 1 block
    for r in (a, b, c):
        s.submit(r)
    p = s.plan()
    assert [x[0] for x in p.prefill] == [a, b] and s.pool.n_free == 0
    assert c.state is State.WAITING and s.position(c) == 1  # fits nowhere now: waits, never overtakes
    s.finish(a, Finish.EOS)
    assert a.blocks == [] and a.finish is Finish.EOS and s.pool.n_free == 4
    s.plan()
    assert c.state is State.PREFILL and s.position(c) == 0


def test_nobody_overtakes_a_waiting_request():
    s = Scheduler(BlockPool(4, 4), max_batch=8)
    big, small = req(12, 4), req(1, 1)  # 4 blocks, 1 block
    running = req(1, 1)
    s.submit(running)
    s.plan()  # running holds 1 block: 3 left
    s.submit(big)
    s.submit(small)
    s.plan()
    assert big.state is State.WAITING and small.state is State.WAITING  # small would fit, but big came first


def test_batch_size_bound():
    s = Scheduler(BlockPool(100, 4), max_batch=2)
    rs = [req() for _ in range(3)]
    for r in rs:
        s.submit(r)
    s.plan()
    assert [r.state for r in rs] == [State.PREFILL, State.PREFILL, State.WAITING]


def test_queue_bound_gives_a_busy_message_at_once():
    s = Scheduler(BlockPool(1, 4), max_batch=1, max_queue=2)
    s.submit(req(1, 1))
    s.submit(req(1, 1))
    with pytest.raises(QueueFull, match="^Server busy: .*try again"):
        s.submit(req(1, 1))


def test_a_request_larger_than_the_pool_is_refused_not_queued_forever():
    s = Scheduler(BlockPool(4, 4))
    with pytest.raises(TooLarge, match="16 tokens.*holds 4 blocks|needs room"):
        s.submit(req(100, 10))
    assert not s.waiting


def test_chunked_prefill_shares_a_token_budget_per_iteration_shortest_remaining_first():
    s = Scheduler(BlockPool(100, 16), prefill_chunk=64)
    long, short = req(150, 4), req(20, 4)
    s.submit(long)
    p = s.plan()
    assert p.prefill == [(long, 0, 64)]  # a long prompt is prefilled in chunks of the budget
    done(s, long, 64)
    s.submit(short)  # a short question arrives meanwhile: it is not stuck behind the long prompt
    p = s.plan()
    assert p.prefill == [(short, 0, 20)]  # it completes this iteration: alone, the long one waits one iteration
    done(s, short, 20)
    p = s.plan()
    assert p.prefill == [(long, 64, 128)] and p.decode == [short]
    done(s, long, 128)
    p = s.plan()
    assert p.prefill == [(long, 128, 150)]


def test_request_chunk_caps_each_prompt_so_iterations_stay_short():
    s = Scheduler(BlockPool(100, 16), prefill_chunk=256, request_chunk=64)
    a, b, c = req(200, 4), req(30, 4), req(100, 4)
    for r in (a, b, c):
        s.submit(r)
    p = s.plan()
    assert p.prefill == [(b, 0, 30)]  # b completes: alone
    done(s, b, 30)
    p = s.plan()
    assert p.prefill == [(c, 0, 64), (a, 0, 64)]  # nobody completes: 128 of the 256, no request above 64


def test_cancel_frees_the_slot_and_blocks_at_the_next_plan():
    s = Scheduler(BlockPool(8, 4), max_batch=1)
    a, b = req(10, 6), req(10, 6)
    s.submit(a)
    s.submit(b)
    s.plan()
    done(s, a, len(a.prompt_ids))
    s.cancel(a)
    p = s.plan()
    assert p.retired == [a] and a.finish is Finish.CANCELLED and a.blocks == []
    assert b.state is State.PREFILL  # admitted into the freed slot the same plan
    s.cancel(b)
    s.submit(c := req(1, 1))
    s.cancel(c)  # cancelled while still waiting
    p = s.plan()
    assert {r.id for r in p.retired} == {b.id, c.id} and s.pool.n_free == 8 and not s.waiting


def test_decode_rows_are_requests_whose_prompt_is_in():
    s = Scheduler(BlockPool(100, 4))
    a, b = req(), req()
    s.submit(a)
    s.submit(b)
    s.plan()
    done(s, a, len(a.prompt_ids))
    p = s.plan()
    assert p.decode == [a] and [x[0] for x in p.prefill] == [b]


def test_prefill_first_the_decode_rows_sit_out_at_most_max_decode_stall_passes_in_a_row():
    s = Scheduler(BlockPool(100, 4), prefill_chunk=64, max_decode_stall=2)
    a = req()
    s.submit(a)
    s.plan()
    done(s, a, 10)
    seen = []
    for _ in range(5):  # a newcomer before every pass: each pass could give one its first token
        s.submit(r := req())
        p = s.plan()
        seen.append(p.decode == [a])
        assert [x[0] for x in p.prefill] == [r]
        done(s, r, 10)
        s.finish(r, Finish.EOS)
    assert seen == [False, False, True, False, False]  # two passes for newcomers, then a's next token
    assert s.plan().decode == [a]  # nobody waiting: a decodes
    long = req(150, 4)
    s.submit(long)
    p = s.plan()
    assert p.decode == [a] and p.prefill[0][2] < 150  # a long prompt's chunk that does not complete: no pause
    assert Scheduler(BlockPool(100, 4)).max_decode_stall == 0  # off unless asked (the engine asks for 2)


def test_submit_is_thread_safe():
    s = Scheduler(BlockPool(1000, 4), max_queue=10_000)
    threads = [threading.Thread(target=lambda: [s.submit(req(1, 1)) for _ in range(50)]) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(s.waiting) == 400 and len({r.id for r in s.waiting}) == 400


def test_prefix_cache_matches_whole_blocks_exactly_from_the_start():
    pool = BlockPool(10, 4)
    a = pool.take(3)
    serial = 0
    for i, b in enumerate(a[:2]):
        serial = pool.register(b, serial, list(range(i * 4, i * 4 + 4)))
    assert pool.match(list(range(12))) == (a[:2], serial)
    assert pool.match(list(range(8)))[0] == a[:1]  # the last token is always computed (its logits)
    assert pool.match([99] + list(range(1, 12))) == ([], 0)  # another first token: nothing, though the rest agrees
    assert pool.match([0, 1, 2, 3, 9, 9, 9, 9, 1])[0] == a[:1]  # a block only after the ones before it
    assert pool.register(a[2], 0, [0, 1, 2, 3]) == pool.match([0, 1, 2, 3, 4])[1]  # computed twice: kept once
    pool.give_back(a)
    assert pool.n_free == 10 and pool.n_cached == 2  # cached blocks nobody holds count as free...
    got = pool.take(8)  # ... empty blocks are taken first
    assert set(got).isdisjoint(a[:2]) and pool.n_cached == 2
    pool.take(1)  # then the least recently freed cached block (the second: freed before the first)
    assert pool.n_cached == 1 and pool.match(list(range(12)))[0] == a[:1]


def test_a_prompt_that_starts_like_a_cached_one_shares_its_blocks_and_skips_their_prefill():
    s = Scheduler(BlockPool(20, 4), max_batch=8)
    a = Request(list(range(1, 11)), 2)  # 10 prompt tokens: 2 full blocks and 2 tokens of a third
    s.submit(a)
    s.plan()
    done(s, a, 6)  # a chunk of 6 done: only the first block is written in every layer
    assert a.registered == 1 and s.pool.n_cached == 1
    done(s, a, 10)
    assert a.registered == 2 and s.pool.n_cached == 2  # the third block (2 prompt tokens, then decode) is not
    b = Request(list(range(1, 9)) + [50, 51, 52], 2)  # the same first 8 tokens, then its own
    s.submit(b)
    p = s.plan()
    assert b.blocks[:2] == a.blocks[:2] and b.cached == b.prefilled == 8 and len(set(b.blocks[2:]) & set(a.blocks)) == 0
    assert p.prefill == [(b, 8, 11)] and p.decode == [a]  # only its 3 new tokens are prefilled
    c = Request(list(range(1, 9)), 2)  # exactly those 2 blocks: the second is computed again for its last token
    s.submit(c)
    s.plan()
    assert c.cached == 4 and c.blocks[0] == a.blocks[0] and c.blocks[1] != a.blocks[1]
    for r in (a, b, c):
        s.finish(r, Finish.EOS)
    assert s.pool.n_free == 20 and s.pool.n_cached == 2  # every block back; the shared ones still cached
    snap = s.snapshot()
    assert (snap.prefix_hit_requests, snap.prefix_hit_tokens, snap.blocks_used) == (2, 12, 0)


def test_cached_blocks_give_way_when_the_pool_needs_them():
    s = Scheduler(BlockPool(4, 4), max_batch=8)
    a = Request(list(range(1, 10)), 3)  # 12 tokens: 3 blocks, 2 of them cached when done
    s.submit(a)
    s.plan()
    done(s, a, 9)
    s.finish(a, Finish.EOS)
    big = Request(list(range(100, 113)), 3)  # 16 tokens: every block of the pool, cached ones included
    s.submit(big)
    s.plan()
    assert big.state is State.PREFILL and big.cached == 0 and s.pool.n_cached == 0 and s.pool.n_free == 0


def test_no_prefix_cache_no_sharing():
    s = Scheduler(BlockPool(20, 4), prefix_cache=False)
    a, b = Request(list(range(1, 11)), 2), Request(list(range(1, 11)), 2)
    s.submit(a)
    s.plan()
    done(s, a, 10)
    s.submit(b)
    s.plan()
    assert s.pool.n_cached == 0 and b.cached == 0 and not set(a.blocks) & set(b.blocks)


def test_the_engines_report_moves_a_request_along_its_life_and_ends_it():
    s = Scheduler(BlockPool(20, 4), max_batch=8)
    a, b, c = Request([1, 2, 3], 3, stop_ids=frozenset({99})), Request([4, 5], 2), Request([6, 7], 5)
    for r in (a, b, c):
        s.submit(r)
    p = s.plan()
    assert [r.state for r in (a, b, c)] == [State.PREFILL] * 3
    ended = s.update(p, PassOutput(prefilled={a.id: 3, b.id: 2, c.id: 2}, tokens={a.id: 10, b.id: 11, c.id: 12}, at=1.0))
    assert ended == {a.id: None, b.id: None, c.id: None} and all(r.state == State.DECODE for r in (a, b, c))
    assert a.generated == [10] and a.first_token_at == a.last_token_at == 1.0
    s.cancel(c)  # Stop pressed while its token is being computed
    p = s.plan()  # retired at the next plan: its blocks come back before the pass
    assert p.retired == [c] and c.finish == Finish.CANCELLED and c.blocks == []
    ended = s.update(p, PassOutput(tokens={a.id: 99, b.id: 13}, at=2.0))
    assert ended == {a.id: Finish.EOS, b.id: Finish.LENGTH}  # a stop token; b's second and last token
    assert all(r.state == State.FINISHED and not r.blocks for r in (a, b)) and s.pool.n_free == 20 and not s.running
    assert s.snapshot().ended == {Finish.EOS: 1, Finish.LENGTH: 1, Finish.CANCELLED: 1}


def test_a_failed_pass_ends_its_requests_with_an_error_and_frees_their_blocks():
    s = Scheduler(BlockPool(8, 4))
    s.submit(a := req(10, 6))
    s.plan()
    s.fail([a])
    assert a.state == State.FINISHED and a.finish == Finish.ERROR and s.pool.n_free == 8


def test_static_batching_keeps_an_ended_row_as_padding_until_its_batch_is_done():
    s = Scheduler(BlockPool(20, 4), policy=Policy.STATIC, static_batch_size=2)
    a, b = Request([1, 2], 1), Request([3, 4], 3)
    s.submit(a)
    assert s.plan().empty  # waits for the whole batch
    s.submit(b)
    p = s.plan()
    s.update(p, PassOutput(prefilled={a.id: 2, b.id: 2}, tokens={a.id: 5, b.id: 6}))
    assert a.state == State.PADDING and a.finish == Finish.LENGTH and a.blocks  # ended, its row kept
    p = s.plan()
    assert p.decode == [a, b] and s.release_static_batch() == []  # padding computed with b
    s.update(p, PassOutput(tokens={b.id: 7}))
    s.update(s.plan(), PassOutput(tokens={b.id: 8}))
    assert b.finish == Finish.LENGTH and s.release_static_batch() == [a, b] and s.pool.n_free == 20
