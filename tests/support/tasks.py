"""Task cells for the tests: prompts with gold answers and their generations, read by the sweep's task."""

from __future__ import annotations

from controller.metrics import cell_data


def records(per_prompt: dict[str, tuple[list[str], object]]) -> list[dict]:
    """Records of a cell: prompt -> (texts, gold); generation seeds in order."""
    out = []
    for pid, (texts, gold) in per_prompt.items():
        for seed, text in enumerate(texts):
            out.append({"text": text, "prompt_id": pid, "seed": seed, "answer": gold})
    return out


def task_cell(per_prompt, task=None):
    """A task cell of `records(per_prompt)`, its answers read by `task` (default: the last number)."""
    cell = cell_data(records(per_prompt))
    cell.task = task or {"extract": ["last_number"]}
    return cell
