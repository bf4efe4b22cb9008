"""Text exactly as the model has it, in every view that shows a prompt, a template or an answer: accents, CJK,
emoji, combining marks and right-to-left text go through each one whole, and a byte piece shows as <0xE6>,
never as U+FFFD."""

import html
import re
from types import SimpleNamespace

import pytest

import pipeline
from components.generation import distribution_figure, token_labels
from components.speculative import steps_html
from components.tokens import chips_html, marked_html, template_html, token_rows
from pipeline.forward.sampling import GREEDY
from pipeline.forward.tokens import display_text, text_of, token_pieces, tokenize
from pipeline.generation import GenerationRecord

pytestmark = pytest.mark.unit

TEXTS = {
    "accents": "naïve café, résumé — Ærøskøbing",
    "cjk": "日本語のテキストと中文",
    "emoji": "Hi 👋🏽 family 👨\u200d👩\u200d👧 🇫🇷",
    "combining": "e\u0301 a\u0308 n\u0303 (decomposed)",
    "rtl": "שלום עולם and مرحبا بالعالم",
}


@pytest.fixture(scope="module", params=["smollm2-135m-instruct", "gemma3-270m"])
def tok(request):
    models = {m.key: m for m in pipeline.available_models()}
    if not models[request.param].available:
        pytest.skip(models[request.param].why)
    return pipeline.model.load_tokenizer(request.param)


def plain(body: str) -> str:
    """What a reader sees of an HTML view: the text without tags, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", body))


def test_display_text_shows_lone_bytes_as_pieces():
    assert display_text("é".encode()) == "é"
    assert display_text("日".encode()[:1]) == "<0xE6>"
    assert display_text(b"a" + "😀".encode()[:2] + b"b") == "a<0xF0><0x9F>b"


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("name", TEXTS)
def test_every_text_view_shows_the_prompt_whole(tok, name, chat):
    text = TEXTS[name]
    tk = tokenize(tok, text, chat=chat)
    ids = tk.input_ids
    whole = text_of(tok, ids)
    in_text = [t.id for t in tk.tokens if t.bytes]  # not the <bos> a tokenizer adds in front of the text
    assert text_of(tok, in_text) == tk.text and text in whole  # the sequence decoded as one: what the model reads
    templated = chat and bool(getattr(tok, "chat_template", None))  # Gemma-3 270M is a base model: no template
    assert tk.chat == templated  # a model without a chat template reads the prompt as plain text
    if templated:  # the template around the prompt is transformers' own rendering, the prompt in it verbatim
        rendered = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        assert tk.text == rendered
        assert tk.text[tk.prompt_start : tk.prompt_start + len(text)] == text and text in text_of(tok, ids, specials=False)
        assert text_of(tok, [t.id for t in tk.prompt_tokens]) == text  # the prompt's own tokens: the text typed
    else:
        assert text_of(tok, ids, specials=False).strip().endswith(text.strip())
    for view in (whole, plain(template_html(tk.tokens)), plain(chips_html(tk.tokens, tk.segments))):
        assert "\ufffd" not in view
    assert plain(template_html(tk.tokens)) == whole  # the chat view: the prompt whole, not token by token
    for t in tk.tokens:  # one token alone: its text, or its bytes as <0xNN> pieces
        one = text_of(tok, [t.id])
        assert "\ufffd" not in one and "\ufffd" not in t.text
        if not t.special:
            assert one == t.text
    assert all("\ufffd" not in str(v) for row in token_rows(tk.tokens) for v in row.values())

    # an answer: the generation page's text, its token buttons and its distribution figure
    pieces = token_pieces(tok)
    events = [
        SimpleNamespace(
            token_id=i, text=text_of(tok, [i]), top=[(i, text_of(tok, [i]), 1.0)], top_raw=[], p=1.0, p_raw=1.0, piece=pieces(i)[0], special=pieces(i)[1]
        )
        for i in ids
    ]
    rec = GenerationRecord(prompt="", chat=False, model="m", max_new_tokens=len(ids), sampling=GREEDY, prompt_tokens=0, events=events)
    assert rec.text() == text_of(tok, ids, specials=False) and "\ufffd" not in rec.text()
    assert all("\ufffd" not in label for label in token_labels(events))
    fig = distribution_figure(events[-1])
    assert all("\ufffd" not in str(t) for tr in fig.data for t in (tr.y or ()))

    # a forced token marked by a box outside the text; the speculative rows
    k = len(ids) // 2
    marked = marked_html(text_of(tok, ids[:k]), text_of(tok, ids[k : k + 1]), text_of(tok, ids[k + 1 :]), "step")
    assert plain(marked).replace("<0x", "").count("[") == tk.text.replace("<0x", "").count("[")  # no marker characters added
    assert "\ufffd" not in plain(marked)
    step = SimpleNamespace(proposed=list(ids[1:4]), accepted=2, correction=ids[4] if len(ids) > 4 else ids[0])
    assert "\ufffd" not in plain(steps_html([step], lambda t: text_of(tok, [t]), first_token=ids[0]))
