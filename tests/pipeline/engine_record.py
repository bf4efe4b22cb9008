"""Recording what an engine samples from (imported by test_exact.py and test_int8.py)."""

import torch


def recording(eng) -> dict[int, list[torch.Tensor]]:
    """Every logits row the engine samples from, by request id, in order (its first token's, then each decode)."""
    seen: dict[int, list[torch.Tensor]] = {}
    outputs = eng._outputs

    def record(reqs, logits):
        for r, row in zip(reqs, logits):
            seen.setdefault(r.id, []).append(row.clone())
        return outputs(reqs, logits)

    eng._outputs = record
    return seen
