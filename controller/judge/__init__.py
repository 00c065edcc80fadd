"""The LLM judge: versioned prompt templates, an OpenAI-compatible client, verdicts, their cache and statistics.

docs/judge.md is the user's guide; controller.sweep.judgespec the sweep spec's `judge:` section.
"""
