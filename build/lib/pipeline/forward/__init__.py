"""One forward pass, in the order a prompt meets it: tokens (pieces, ids, special tokens, the chat template), the
hooked trace of every layer (tracing), the readouts computed from it (analysis), and the next-token distribution
with temperature, top-k, top-p and min-p (sampling)."""
