"""Tokenize: text -> subword pieces -> token ids, with byte-exact display and grapheme-safe segments.

Every token carries its raw vocabulary `piece` (e.g. 'ĠParis' in a byte-level BPE), the exact `bytes` it
stands for, a display `text` (its bytes decoded; a token holding only part of a multi-byte character
shows its bytes as hex instead of a replacement glyph) and char `start`/`end` into the text the model
reads. Tokens are grouped into `Segment`s whose boundaries fall on grapheme boundaries, so an emoji split
over three tokens is shown once, as the emoji, with its three ids under it (tiktokenizer's approach).

Text typed by the user is never parsed for special tokens: '<|im_end|>' typed in a prompt becomes the
ordinary pieces of that text. Special tokens come only from the chat template or the tokenizer's own
BOS/EOS additions.
"""

from __future__ import annotations

import codecs
import json
import weakref
from dataclasses import dataclass
from functools import lru_cache

import regex

from pipeline.common.memo import per_object

SENTINEL = "\ue000USER\ue001"  # private-use chars: never produced by a template


@dataclass(frozen=True)
class Token:
    id: int
    piece: str  # raw vocabulary string
    bytes: bytes  # exact bytes this token stands for
    text: str  # display text: decoded bytes, or hex for a partial character
    start: int  # char offsets into Tokenized.text
    end: int
    special: bool
    segment: int  # index into Tokenized.segments


@dataclass(frozen=True)
class Segment:
    text: str  # whole graphemes
    start: int
    end: int
    token_indices: tuple[int, ...]


@dataclass(frozen=True)
class Tokenized:
    text: str  # what the model reads (the chat template rendered around the prompt in chat mode)
    prompt: str  # what the user typed
    chat: bool
    tokens: tuple[Token, ...]
    segments: tuple[Segment, ...]
    exact: bool  # True when the token bytes reassemble `text` exactly
    prompt_start: int = 0  # where the user's prompt begins inside `text`

    @property
    def input_ids(self) -> list[int]:
        return [t.id for t in self.tokens]

    @property
    def prompt_tokens(self) -> list[Token]:
        """The tokens that come from the user's prompt (not the template, not BOS/EOS)."""
        lo, hi = self.prompt_start, self.prompt_start + len(self.prompt)
        return [t for t in self.tokens if not t.special and t.bytes and lo <= t.start and t.end <= hi]


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    # GPT-2's reversible byte <-> printable unicode map, as used by byte-level BPE tokenizers.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


@per_object
def _scheme(tok) -> str:
    try:
        dec = json.loads(tok.backend_tokenizer.to_str()).get("decoder") or {}
    except Exception:
        return "decode"
    kinds = json.dumps(dec)
    if '"ByteLevel"' in kinds:
        return "bytelevel"
    if '"ByteFallback"' in kinds or '"Metaspace"' in kinds or "\u2581" in kinds:
        return "sentencepiece"
    return "decode"


_HEX = regex.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def piece_bytes(tok, piece: str, tid: int, scheme: str) -> bytes:
    """The exact bytes a (non-special) vocabulary piece stands for."""
    if scheme == "bytelevel":
        dec = _byte_decoder()
        if all(c in dec for c in piece):
            return bytes(dec[c] for c in piece)
    elif scheme == "sentencepiece":
        m = _HEX.match(piece)
        if m:
            return bytes([int(m.group(1), 16)])
        return piece.replace("\u2581", " ").encode("utf-8")
    return tok.decode([tid]).encode("utf-8")


def _bytes_as_pieces(err: UnicodeDecodeError):
    return "".join(f"<0x{b:02X}>" for b in err.object[err.start : err.end]), err.end


codecs.register_error("llm_explorer.bytes", _bytes_as_pieces)


def display_text(b: bytes) -> str:
    """Decoded bytes; bytes that are only part of a character are shown as byte pieces, `<0xE6>` (the way
    SentencePiece vocabularies spell them), never as the replacement glyph U+FFFD."""
    return b.decode("utf-8", errors="llm_explorer.bytes")


@per_object
def _id_bytes(tok):
    """id -> (exact bytes, special) for one tokenizer, cached (a page asks for the same ids again and again)."""
    scheme = _scheme(tok)
    special_ids = set(getattr(tok, "all_special_ids", []) or [])
    ref = weakref.ref(tok)  # the memo's value must not hold its key alive

    @lru_cache(maxsize=65536)
    def of(tid: int) -> tuple[bytes, bool]:
        tok = ref()
        piece = tok.convert_ids_to_tokens(int(tid))
        if piece is None:
            return b"", False
        if tid in special_ids:
            return piece.encode("utf-8"), True
        return piece_bytes(tok, piece, int(tid), scheme), False

    return of


def text_of(tok, ids, specials: bool = True) -> str:
    """THE way token ids become text on a page, a slide or an export: the ids' exact bytes joined and decoded as
    one sequence (so a character split over several byte pieces shows whole, as the model has it), a byte that
    is only part of a character as `<0xE6>`, and special tokens as their piece (`<|im_end|>`), or left out with
    `specials=False` (an answer as a reader sees it). One id gives that token's own text."""
    of = _id_bytes(tok)
    return join_pieces((of(int(tid)) for tid in ids), specials)


def join_pieces(pieces, specials: bool = True) -> str:
    """text_of for pieces already looked up: (exact bytes, special) per token, as token_pieces gives them and a
    generation's events carry them (so an answer's text needs no tokenizer)."""
    out, run = [], bytearray()
    for b, special in pieces:
        if special:
            out.append(display_text(bytes(run)))
            run.clear()
            if specials:
                out.append(b.decode("utf-8"))
        else:
            run.extend(b)
    out.append(display_text(bytes(run)))
    return "".join(out)


def chat_parts(tok, prompt: str) -> list[tuple[str, bool]] | None:
    """The chat template rendered around the prompt, as (text, parse_special) parts; None without a template."""
    if not getattr(tok, "chat_template", None):
        return None
    rendered = tok.apply_chat_template([{"role": "user", "content": SENTINEL}], tokenize=False, add_generation_prompt=True)
    before, sep, after = rendered.partition(SENTINEL)
    if not sep:
        return None
    return [(before, True), (prompt, False), (after, True)]


def _encode(tok, text: str, parse_special: bool) -> list[int]:
    if not text:
        return []
    return tok(text, add_special_tokens=False, split_special_tokens=not parse_special)["input_ids"]


@per_object
def _added_ids(tok) -> frozenset[int]:
    """The ids of the tokenizer's added vocabulary (asked once per tokenizer: transformers rebuilds it per call)."""
    return frozenset(tok.get_added_vocab().values()) if hasattr(tok, "get_added_vocab") else frozenset()


@per_object
def added_specials(tok) -> tuple[list[int], list[int]]:
    """Special ids the tokenizer adds around plain text (e.g. Gemma's <bos>): (prefix, suffix)."""
    probe = "a b"
    with_ = tok(probe, split_special_tokens=True)["input_ids"]
    without = tok(probe, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    for i in range(len(with_) - len(without) + 1):
        if with_[i : i + len(without)] == without:
            return with_[:i], with_[i + len(without) :]
    return [], []


def tokenize(tok, prompt: str, chat: bool = False) -> Tokenized:
    """Tokenize `prompt` (chat=True wraps it in the model's chat template first)."""
    parts = chat_parts(tok, prompt) if chat else None
    chat = parts is not None
    if parts is None:
        parts = [(prompt, False)]
        prefix, suffix = added_specials(tok)
    else:
        prefix, suffix = [], []
    text = "".join(p for p, _ in parts)
    raw, exact = _raw_tokens(tok, parts, prefix, suffix)
    tokens, segments = _place(tok, text, raw, exact)
    return Tokenized(
        text=text, prompt=prompt, chat=chat, tokens=tuple(tokens), segments=tuple(segments), exact=exact, prompt_start=len(parts[0][0]) if chat else 0
    )


def _raw_tokens(tok, parts: list[tuple[str, bool]], prefix: list[int], suffix: list[int]) -> tuple[list[tuple[int, bytes | None, bool]], bool]:
    """Each part encoded (special tokens parsed only in the template's own parts) as (id, bytes, special), with the
    tokenizer's own additions around it as (id, None, True): None bytes = zero-width, not in the text. exact: the
    tokens' bytes reassemble every part (False for a normalising tokenizer: offsets are then approximate)."""
    scheme = _scheme(tok)
    special_ids = set(getattr(tok, "all_special_ids", []) or [])
    added = _added_ids(tok)
    raw: list[tuple[int, bytes | None, bool]] = [(i, None, True) for i in prefix]
    exact = True
    for part, parse_special in parts:
        ids = _encode(tok, part, parse_special)
        pieces = tok.convert_ids_to_tokens(ids)
        got = []
        for tid, piece in zip(ids, pieces):
            is_special = parse_special and (tid in special_ids or tid in added)
            b = piece.encode("utf-8") if is_special else piece_bytes(tok, piece, tid, scheme)
            got.append((tid, b, is_special))
        if b"".join(b for _, b, _ in got) != part.encode("utf-8"):
            exact = False
        raw.extend(got)
    raw.extend((i, None, True) for i in suffix)
    return raw, exact


def _byte_map(text: str) -> tuple[list[int], set[int]]:
    """For each byte offset of text's UTF-8, the char it falls in (one more entry: the end), and the byte offsets
    where a grapheme begins or the text ends."""
    char_at_byte = [0] * (len(text.encode("utf-8")) + 1)
    pos = 0
    for ci, ch in enumerate(text):
        n = len(ch.encode("utf-8"))
        for k in range(n):
            char_at_byte[pos + k] = ci
        pos += n
    char_at_byte[pos] = len(text)
    bounds, pos = {0}, 0
    for g in regex.findall(r"\X", text):
        pos += len(g.encode("utf-8"))
        bounds.add(pos)
    return char_at_byte, bounds


def _place(tok, text: str, raw: list[tuple[int, bytes | None, bool]], exact: bool) -> tuple[list[Token], list[Segment]]:
    """The raw tokens placed in `text` (char offsets from their bytes) and grouped into segments that end on
    grapheme boundaries (each token its own segment where the offsets are not exact)."""
    char_at_byte, bounds = _byte_map(text)
    tokens: list[Token] = []
    segments: list[Segment] = []
    pending: list[int] = []
    bpos = 0
    nbytes = len(char_at_byte) - 1
    for tid, b, special in raw:
        piece = tok.convert_ids_to_tokens(tid)
        if b is None:
            s = e = char_at_byte[min(bpos, nbytes)]
            tokens.append(Token(tid, piece, b"", piece, s, e, True, len(segments)))
            segments.append(Segment("", s, e, (len(tokens) - 1,)))
            continue
        b0, b1 = min(bpos, nbytes), min(bpos + len(b), nbytes)
        s = char_at_byte[b0]
        e = char_at_byte[b1 - 1] + 1 if b1 > b0 else s
        bpos += len(b)
        tokens.append(Token(tid, piece, b, display_text(b) if not special else piece, s, max(e, s), special, len(segments)))
        pending.append(len(tokens) - 1)
        if bpos in bounds or bpos >= nbytes or not exact:
            first = tokens[pending[0]]
            seg_s, seg_e = first.start, char_at_byte[min(bpos, nbytes)]
            segments.append(Segment(text[seg_s:seg_e], seg_s, seg_e, tuple(pending)))
            pending = []
    if pending:
        first = tokens[pending[0]]
        segments.append(Segment(text[first.start :], first.start, len(text), tuple(pending)))
    return tokens, segments


def token_texts(tokenizer):
    """One token's text (text_of: a byte piece as `<0xE6>`, never U+FFFD) as a function of its id, cached
    (candidates repeat from step to step): what a generation's events carry."""
    return lru_cache(maxsize=65536)(lambda i: text_of(tokenizer, [i]))


def token_pieces(tokenizer):
    """One token's (exact bytes, special) as a function of its id, cached: what a generation's events carry so that
    the answer's text is join_pieces of them."""
    return _id_bytes(tokenizer)
