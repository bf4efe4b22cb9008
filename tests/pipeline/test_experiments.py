"""The experiments the batching and attention-kernels pages run, small enough for make test (the pages themselves
run them in full in the load tier): every policy's answers equal each request alone, static batching pads, and
every attention kernel gives eager attention's logits."""

import pytest

from pipeline.common.timing import ACTIVITY
from pipeline.lab import checks
from pipeline.lab.attention_kernels import kernel_sweep
from pipeline.lab.scene import POLICIES, User, run_alone, run_scene

pytestmark = pytest.mark.model


def test_every_policy_answers_each_user_as_alone_and_static_pads(smol):
    users = [User("Alice", 0.0, "Why is the sky blue?", 6), User("Bob", 0.0, "Dog bites man.", 3)]
    alone = {u.name: run_alone(smol, u) for u in users}
    with ACTIVITY.doing("experiment") as scene:  # as the page runs it (views.runs.timed)
        runs = {p: run_scene(smol, users, p) for p in POLICIES}
    assert not scene.busy, scene.busy  # page 15 alone: its own users' steps are not "other generations"
    for p, run in runs.items():
        assert {u.name: u.token_ids for u in run.users} == alone, p
    padded = sum(len(r.padded) for r in runs["static"].records)
    assert padded == 6 - 3  # Bob's row is computed as padding until Alice is done
    assert sum(len(r.padded) for r in runs["continuous"].records) == 0


def test_every_attention_kernel_gives_eager_logits(smol):
    rows = kernel_sweep(smol, [32], repeats=1)
    assert {r.kernel for r in rows} >= {"eager"} and len(rows) >= 2
    assert checks.check_kernels_agree(rows, smol.arch.tol).ok, [(r.kernel, r.max_diff_vs_eager, r.error) for r in rows]
