"""Why this token (pipeline.forward.attribution, `python -m pipeline explain`): the shares of the logit sum to the
model's own logit on both architectures (Gemma-3's sandwich norms included), and switching a component off through
hooks equals a plain forward of the model with that component's weights zeroed (an independent computation)."""

import io
import json

import numpy as np
import pytest
import torch

from pipeline.__main__ import main
from pipeline.forward.attribution import FLOW_MAX_TOKENS, Ablation, Component, Kind, PatchOver, ablate, attribute, flow, patch
from pipeline.forward.tracing import trace
from pipeline.model.capture import as_traced

pytestmark = pytest.mark.model
PROMPT = "The capital of France is"


def one(lm, text):
    (i,) = lm.tokenizer.encode(text, add_special_tokens=False)
    return i


def test_the_shares_sum_to_the_logit_for_a_token_and_for_a_difference(lm):
    tr = trace(lm, PROMPT)
    paris, london = one(lm, " Paris"), one(lm, " London")
    a = attribute(lm, tr, paris)
    assert a.heads.shape == (lm.facts.n_layers, lm.facts.n_heads) and a.ffn.shape == (lm.facts.n_layers,)
    assert abs(a.total - a.logit) < 1e-3 * max(1.0, abs(a.logit)), (a.total, a.logit)
    d = attribute(lm, tr, paris, versus=london)
    assert abs(d.total - d.logit) < 1e-3 * max(1.0, abs(d.logit))
    b = attribute(lm, tr, london)
    assert abs(d.logit - (a.logit - b.logit)) < 1e-3 and abs(d.heads - (a.heads - b.heads)).max() < 1e-4  # linear in the target
    top, share = a.largest(1)[0]
    assert abs(share) == max(abs(a.embedding), abs(a.heads).max(), abs(a.ffn).max()) and a.share(top) == share
    assert Component.parse(str(top)) == top and a.logit == float(tr.next_logits[paris])  # the trace's own logit: no second forward


def test_switching_a_head_off_equals_zeroing_its_slice_of_o_proj(lm):
    tr = trace(lm, PROMPT)
    ids = tr.input_ids
    layer, head, D = lm.facts.n_layers // 2, 1, lm.facts.head_dim
    got = ablate(lm, tr, [Component(Kind.HEAD, layer, head)])
    W = lm.arch.layers[layer].self_attn.o_proj.weight
    saved = W.detach().clone()
    try:
        with lm.lock, torch.no_grad(), as_traced():
            W[:, head * D : (head + 1) * D] = 0
            ref = torch.softmax(lm.model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)
    finally:
        with torch.no_grad():
            W.copy_(saved)
    assert (got.after - ref).abs().max() < 1e-6 and got.kl > 0
    assert torch.equal(ablate(lm, tr).after, got.before)  # nothing switched off: nothing changes


def test_switching_a_feed_forward_block_off_equals_zeroing_its_down_projection(lm):
    tr = trace(lm, PROMPT)
    ids = tr.input_ids
    layer = lm.facts.n_layers - 1
    got = ablate(lm, tr, [f"{layer}.mlp"])
    W = lm.arch.layers[layer].mlp.down_proj.weight
    saved = W.detach().clone()
    try:
        with lm.lock, torch.no_grad(), as_traced():
            W.zero_()
            ref = torch.softmax(lm.model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)
    finally:
        with torch.no_grad():
            W.copy_(saved)
    assert (got.after - ref).abs().max() < 1e-6


def test_mean_ablation_of_a_one_token_prompt_changes_nothing(smol):
    """The mean over a single position is that position's own value."""
    tr = trace(smol, "Dog")
    assert tr.T == 1
    d = ablate(smol, tr, [Component(Kind.HEAD, 3, 2), Component(Kind.FFN, 5)], Ablation.MEAN)
    assert (d.after - d.before).abs().max() < 1e-6 and d.new_rank == 0


def test_bad_components_are_refused_with_a_clear_message(smol):
    tr = trace(smol, PROMPT)
    with pytest.raises(ValueError, match="no head 99 in layer 0"):
        ablate(smol, tr, ["L0 H99"])
    with pytest.raises(ValueError, match="mode"):
        ablate(smol, tr, mode="random")
    with pytest.raises(ValueError, match="cannot be switched off"):
        ablate(smol, tr, ["embedding"])
    assert main(["explain", PROMPT, "--ablate", "layer five"], out=io.StringIO()) == 2
    assert main(["explain", PROMPT, "--token", "999999999"], out=io.StringIO()) == 2  # outside the vocabulary
    assert main(["explain", "", "--json"], out=io.StringIO()) == 2  # an empty prompt


def test_the_cli_explains_paris(smol):
    out = io.StringIO()
    assert main(["explain", PROMPT, "--token", " Paris", "--versus", " London", "--ablate", "29.mlp", "--json"], out=out) == 0
    res = json.loads(out.getvalue())
    assert res["token"] == {"id": one(smol, " Paris"), "text": " Paris"} and abs(res["sum"] - res["logit"]) < 1e-3
    kinds = {c["kind"] for c in res["components"]}
    assert kinds <= {"embed", "head", "mlp", "bias"} and len(res["components"]) >= smol.facts.n_layers * (smol.facts.n_heads + 1) + 1
    assert abs(sum(c["contribution"] for c in res["components"]) - res["logit"]) < 1e-3
    assert res["ablation"]["token"] == " Paris" and res["ablation"]["p_after"] < res["ablation"]["p_before"]
    out = io.StringIO()
    assert main(["explain", PROMPT, "--token", str(one(smol, " Paris")), "--json"], out=out) == 0  # an id works too
    assert json.loads(out.getvalue())["token"]["text"] == " Paris"


def test_next_with_heads_switched_off_equals_transformers_with_them_zeroed(smol):
    """`next --ablate 5.3,7.mlp` at temperature 1: the softmax of a transformers forward in which a hook zeroes head
    3's slice of layer 5's o_proj input and layer 7's feed-forward output (probabilities within 1e-4)."""
    out = io.StringIO()
    assert main(["next", PROMPT, "--ablate", "5.3,7.mlp", "-n", "5", "--json"], out=out) == 0
    top = json.loads(out.getvalue())["top"]
    D = smol.facts.head_dim

    def head_off(_m, args):
        x = args[0].clone()
        x[..., 3 * D : 4 * D] = 0
        return (x,)

    ids = trace(smol, PROMPT).input_ids
    hooks = [smol.arch.layers[5].self_attn.o_proj.register_forward_pre_hook(head_off)]
    hooks.append(smol.arch.layers[7].mlp.register_forward_hook(lambda _m, _a, o: torch.zeros_like(o)))
    try:
        with smol.lock, torch.no_grad():
            ref = torch.softmax(smol.model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)
    finally:
        for h in hooks:
            h.remove()
    assert all(abs(c["p"] - float(ref[c["id"]])) < 1e-4 for c in top), [(c["p"], float(ref[c["id"]])) for c in top]


def test_switching_every_head_off_is_refused(smol):
    every = [Component(Kind.HEAD, i, h) for i in range(smol.facts.n_layers) for h in range(smol.facts.n_heads)]
    with pytest.raises(ValueError, match="every one of the"):
        ablate(smol, trace(smol, PROMPT), every)


EIFFEL, COLOSSEUM = "The Eiffel Tower is in the city of", "The Colosseum is in the city of"


def test_patching_restores_the_clean_answer_where_it_must_and_each_cell_equals_a_patch_alone(lm):
    """Patching every position of a layer reproduces the clean run (the last layer's last position alone does, since
    only it feeds the prediction); one cell of the batched grid equals the same patch done alone, by hand."""
    ct, kt = trace(lm, EIFFEL), trace(lm, COLOSSEUM)
    clean, corrupt = ct.input_ids, kt.input_ids
    assert len(clean) == len(corrupt)
    p = patch(lm, ct, kt)
    assert lm.tokenizer.decode([p.clean_token]).strip() == "Paris" and p.clean_diff > 0 > p.corrupt_diff
    assert p.grid.shape == (lm.facts.n_layers, len(clean))
    assert abs(p.grid[-1, -1] - 1) < 1e-3 and abs(p.grid[-1, :-1]).max() < 1e-3  # after the last layer only the last position counts
    layer, pos = lm.facts.n_layers // 2, 3
    a, b = p.clean_token, p.corrupt_token
    with lm.lock, torch.no_grad():
        states = {}
        h = lm.arch.layers[layer].register_forward_hook(lambda _m, _a, o: states.__setitem__("clean", (o[0] if isinstance(o, tuple) else o).clone()))
        lm.model(input_ids=torch.tensor([clean]))
        h.remove()

        def restore(_m, _a, o):
            x = (o[0] if isinstance(o, tuple) else o).clone()
            x[0, pos] = states["clean"][0, pos]
            return (x, *o[1:]) if isinstance(o, tuple) else x

        h = lm.arch.layers[layer].register_forward_hook(restore)
        lg = lm.model(input_ids=torch.tensor([corrupt])).logits[0, -1].float()
        h.remove()
    alone = (float(lg[a] - lg[b]) - p.corrupt_diff) / (p.clean_diff - p.corrupt_diff)
    assert abs(alone - p.grid[layer, pos]) < 1e-3, (alone, p.grid[layer, pos])


def test_patching_prompts_of_different_lengths_says_why(smol):
    with pytest.raises(ValueError, match="same number of tokens"):
        patch(smol, trace(smol, "Dog bites man."), trace(smol, "A man was bitten by a dog."))
    out = io.StringIO()
    assert main(["patch", EIFFEL, COLOSSEUM, "--json"], out=out) == 0
    res = json.loads(out.getvalue())
    assert res["clean_answer"] == " Paris" and len(res["grid"]) == smol.facts.n_layers and len(res["grid"][0]) == len(res["tokens"])


def test_head_patching_cell_equals_that_head_restored_alone_and_the_cli_prints_it(lm):
    """The layer x head grid: row h of a layer's batched forward restores head h's output (its slice of o_proj's input)
    at every position; one cell equals the same patch done alone by hand."""
    ct, kt = trace(lm, EIFFEL), trace(lm, COLOSSEUM)
    clean, corrupt = ct.input_ids, kt.input_ids
    p = patch(lm, ct, kt, over=PatchOver.HEAD)
    H, D = lm.facts.n_heads, lm.facts.head_dim
    assert p.over is PatchOver.HEAD and p.grid.shape == (lm.facts.n_layers, H)
    layer, head = lm.facts.n_layers - 1, 1
    o_proj = lm.arch.layers[layer].self_attn.o_proj
    with lm.lock, torch.no_grad():
        z = {}
        h = o_proj.register_forward_pre_hook(lambda _m, a: z.__setitem__("clean", a[0].clone()))
        lm.model(input_ids=torch.tensor([clean]))
        h.remove()

        def restore(_m, a):
            x = a[0].clone()
            x[..., head * D : (head + 1) * D] = z["clean"][..., head * D : (head + 1) * D]
            return (x,)

        h = o_proj.register_forward_pre_hook(restore)
        lg = lm.model(input_ids=torch.tensor([corrupt])).logits[0, -1].float()
        h.remove()
    alone = (float(lg[p.clean_token] - lg[p.corrupt_token]) - p.corrupt_diff) / (p.clean_diff - p.corrupt_diff)
    assert abs(alone - p.grid[layer, head]) < 1e-3, (alone, p.grid[layer, head])
    with pytest.raises(ValueError, match="position"):
        patch(lm, ct, kt, over="neuron")


def test_the_contribution_graph_matches_an_independent_forward_and_leads_to_the_prediction(lm):
    """Each position's shares sum to 1; a head's numbers at the last position equal transformers' own eager attention
    weights x |o_proj's slice of that head applied to v_proj's output| (GQA: the head's key-value group); every edge
    drawn lies on a path to the last position after the last layer."""
    tr = trace(lm, PROMPT)
    ids = tr.input_ids
    fl = flow(lm, tr)
    L, H, KV, D, T = lm.facts.n_layers, lm.facts.n_heads, lm.facts.n_kv_heads, lm.facts.head_dim, len(ids)
    assert fl.edges.shape == (L, T, T) and abs(fl.edges.sum(-1) + fl.residual - 1).max() < 1e-5
    assert (fl.edges[:, np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0).all()  # nothing from later tokens
    impl = lm.model.config._attn_implementation
    vs, hooks = (
        {},
        [layer.self_attn.v_proj.register_forward_hook(lambda _m, _a, o, i=i: vs.__setitem__(i, o[0].clone())) for i, layer in enumerate(lm.arch.layers)],
    )
    try:
        lm.model.set_attn_implementation("eager")
        with lm.lock, torch.no_grad():
            att = lm.model(input_ids=torch.tensor([ids]), output_attentions=True, use_cache=False).attentions
    finally:
        lm.model.set_attn_implementation(impl)
        for h in hooks:
            h.remove()
    for i, head in ((1, 0), (L // 2, H - 1), (L - 1, H // 2)):
        W = lm.arch.layers[i].self_attn.o_proj.weight.detach().float()[:, head * D : (head + 1) * D]
        v = vs[i].float().view(T, KV, D)[:, head // (H // KV)]
        ref = (att[i][0, head, -1].float() * (v @ W.T).norm(dim=-1)).numpy()
        assert np.allclose(fl.last[i, head], ref, rtol=3e-3, atol=1e-4), (i, head, fl.last[i, head], ref)
    edges = fl.graph(0.1)
    assert edges and any(layer == L - 1 and i == T - 1 for layer, _, i, _ in edges)
    targets = {(L, T - 1)}
    for layer in range(L - 1, -1, -1):  # every edge ends at a node that itself leads on to the prediction
        here = [(j, i) for lay, j, i, _ in edges if lay == layer]
        assert all((layer + 1, i) in targets for _, i in here)
        targets |= {(layer, j) for j, _ in here}
    with pytest.raises(ValueError, match="at most"):
        flow(lm, trace(lm, " Paris" * (FLOW_MAX_TOKENS + 1)))


def test_attribution_and_the_graph_read_the_trace_and_never_run_the_model(smol, monkeypatch):
    """The shares and the contribution graph come from the trace's activation cache (blocks.*.attn.hook_z|last, the
    stream, the patterns and values): with the model's forward made to fail, both still compute, and ablation's
    "before" is the trace's own distribution (its one forward is the intervention)."""
    tr = trace(smol, PROMPT)

    def no_forward(*_a, **_k):
        raise AssertionError("a forward pass ran")

    monkeypatch.setattr(smol.model, "forward", no_forward)
    a = attribute(smol, tr)
    fl = flow(smol, tr)
    assert abs(a.total - a.logit) < 1e-3 and fl.edges.shape[0] == smol.facts.n_layers
    with pytest.raises(AssertionError, match="a forward pass ran"):
        ablate(smol, tr, ["L3 H2"])
    monkeypatch.undo()
    d = ablate(smol, tr, ["L3 H2"])
    assert torch.equal(d.before, torch.softmax(torch.from_numpy(tr.next_logits), -1))


def test_ablation_follows_the_candidate_asked_about(smol):
    """The why page explains a chosen candidate (" London"), so switching components off reports that candidate's rank,
    not the model's top token's; by default it follows the top token."""
    tr = trace(smol, PROMPT)
    london = one(smol, " London")
    d = ablate(smol, tr, ["L3 H2"], token=london)
    assert d.token == london and d.new_rank == int((d.after > d.after[london]).sum()) and d.new_rank > 0
    assert ablate(smol, tr, ["L3 H2"]).token == int(tr.next_logits.argmax())
    assert ablate(smol, tr, token=london).new_rank == int((d.before > d.before[london]).sum())  # nothing off: its rank before
