"""MAUVE features: each text's final hidden state at its last token under the featurizer model.

As mauve-text's own `featurize_tokens_from_model` does with GPT-2 (`hidden_states[-1][:, -1, :]`
of the text cut to its first `max_tokens` tokens), here batched with left padding, so the
last position of every row is its text's last token. The controller computes MAUVE from these
stored features (controller.metrics.divergence) and never loads a model. The planner says
whether a job is featurized (`JobSpec.compute`, from the metric registry).
"""

from __future__ import annotations

import torch

from worker.engine.models import LoadedModel


def featurize(featurizer: LoadedModel, texts: list[str], max_tokens: int, batch_size: int) -> list[list[float]]:
    """One feature vector per text (float32 values as Python floats), in the order of `texts`."""
    tok = featurizer.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    rows = [(tok(t)["input_ids"] or [pad])[:max_tokens] for t in texts]
    out: list[list[float]] = []
    for i in range(0, len(rows), batch_size):
        chunk = rows[i : i + batch_size]
        width = max(len(r) for r in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        attn = torch.zeros((len(chunk), width), dtype=torch.long)
        for r, seq in enumerate(chunk):
            ids[r, width - len(seq) :] = torch.tensor(seq)
            attn[r, width - len(seq) :] = 1
        ids, attn = ids.to(featurizer.device), attn.to(featurizer.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        with torch.inference_mode():
            hidden = featurizer.model(
                input_ids=ids, attention_mask=attn, position_ids=pos, output_hidden_states=True
            ).hidden_states[-1]
        out.extend(hidden[:, -1, :].float().cpu().tolist())
    return out
