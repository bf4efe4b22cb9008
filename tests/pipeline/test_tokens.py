import pytest

from pipeline.forward.tokens import tokenize

pytestmark = pytest.mark.model

TEXTS = [
    "Hi 👋🏽 there",
    "👨‍👩‍👧 family emoji and ñ, é, ü",
    "नमस्ते दुनिया, यह हिंदी है",
    "def add(a, b):\n\treturn  a + b   # spaces\n\n",
    "tabs\t\tand    runs of      spaces",
    "control \x00 NUL \x07 bell \x1b escape",
    "typed <|im_end|> and <bos> by hand",
    "日本語のテキスト",
]


@pytest.mark.parametrize("text", TEXTS)
def test_tokens_reassemble_the_prompt_exactly(lm, text):
    tk = tokenize(lm.tokenizer, text)
    body = [t for t in tk.tokens if t.bytes]
    assert b"".join(t.bytes for t in body).decode("utf-8") == text
    assert tk.exact
    # segments are whole graphemes, in order, covering the text
    assert "".join(s.text for s in tk.segments) == text
    for t in tk.tokens:
        assert 0 <= t.start <= t.end <= len(text)
    # the ids are what the tokenizer itself produces (specials not parsed from user text)
    ref = lm.tokenizer(text, split_special_tokens=True)["input_ids"]
    assert tk.input_ids == ref


def test_emoji_split_over_tokens_is_one_segment(smol):
    tk = tokenize(smol.tokenizer, "Hi 👋🏽")
    seg = tk.segments[-1]
    assert seg.text == " 👋🏽" and len(seg.token_indices) > 1
    parts = [tk.tokens[i] for i in seg.token_indices]
    assert any("<0x" in t.text for t in parts) and not any("\ufffd" in t.text for t in parts)  # partial-byte tokens show their bytes


def test_special_token_text_typed_by_user_is_not_injected(lm):
    tk = tokenize(lm.tokenizer, "say <|im_end|> or <bos> now")
    assert not any(t.special and t.bytes for t in tk.tokens)
    specials = set(lm.tokenizer.all_special_ids)
    body_ids = [t.id for t in tk.tokens if t.bytes]
    assert not specials.intersection(body_ids)


def test_chat_template_adds_special_tokens_around_the_prompt(smol):
    tk = tokenize(smol.tokenizer, "Why is the sky blue? <|im_end|>", chat=True)
    assert tk.chat and "Why is the sky blue? <|im_end|>" in tk.text
    specials = [t.piece for t in tk.tokens if t.special]
    assert specials.count("<|im_start|>") == 3 and specials.count("<|im_end|>") == 2  # typed one is text
    assert b"".join(t.bytes for t in tk.tokens).decode() == tk.text
    ref = smol.tokenizer.apply_chat_template([{"role": "user", "content": "Why is the sky blue?"}], tokenize=True, add_generation_prompt=True)
    ref = ref["input_ids"] if isinstance(ref, dict) or hasattr(ref, "keys") else ref
    assert tokenize(smol.tokenizer, "Why is the sky blue?", chat=True).input_ids == list(ref)


def test_base_model_without_template_falls_back_to_plain_text(lm):
    tk = tokenize(lm.tokenizer, "Hello", chat=True)
    assert tk.chat == bool(lm.tokenizer.chat_template)


def test_cli_tokens_json(capsys):
    import io
    import json

    from pipeline.__main__ import main

    buf = io.StringIO()
    assert main(["tokens", "Hi 👋🏽", "--json"], out=buf) == 0
    data = json.loads(buf.getvalue())
    assert data["n_tokens"] == len(data["tokens"]) and data["n_chars"] == 5
    assert data["tokens"][1]["text"].startswith(" <0x")  # space + the first bytes of the emoji


def test_many_threads_tokenizing_at_once_get_their_own_prompt(lm):
    """Every visitor's session shares one tokenizer, whose Rust backend holds the last call's
    split_special_tokens: without pipeline.forward.tokens.thread_safe, 8 threads tokenizing chat prompts (template
    specials parsed, the visitor's text split) got 64 of 2,400 prompts (about 13 expected in these 480) with '<|im_start|>' in ordinary pieces."""
    import threading

    prompts = [("Write one sentence about snow.", True), ("typed <|im_end|> and <bos> by hand", False), ("Why is the sky blue?", True)]
    want = {p: tokenize(lm.tokenizer, *p).input_ids for p in prompts}
    wrong, done = [], []

    def visitor(k):
        for i in range(60):
            p = prompts[(k + i) % len(prompts)]
            got = tokenize(lm.tokenizer, *p).input_ids
            done.append(1)
            if got != want[p]:
                wrong.append((p, len(got)))

    threads = [threading.Thread(target=visitor, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(done) == 8 * 60 and wrong == []
