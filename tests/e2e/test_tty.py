"""`decodebench run` at a real terminal (issue 28, items 3 and 5): a subprocess whose stdout and stderr
are a pseudo-terminal, as a user's shell gives it, with info-level log lines while the progress bar is
live, and a sweep whose names carry terminal escape sequences. Every log line lands on a line of its
own above the bar (never spliced into a drawing of it), the bar counts every job, and the payloads
are shown as escapes, not run: click strips CSI codes only when piped, so a TTY is where they would
act. The test reads the raw bytes the terminal would have received."""

from __future__ import annotations

import errno
import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from tests.support.services import PROMPTS, TINY_MODEL

SPEC = """
name: "evil\\e[2J\\e]0;pwned\\a\\e]8;;http://evil.example\\e\\\\click\\e]8;;\\e\\\\"
models:
  - path: {model}
    name: "tiny\\e[2J\\e]0;pwned\\a"
prompts:
  path: {prompts}
  limit: 4
  shard_size: 1
strategies:
  - name: greedy
  - name: top_k
    params: {{k: 5}}
generation:
  max_new_tokens: 4
  seeds: [0, 1]
  warmup: false
"""
JOBS = 4 + 4 * 2  # greedy once per prompt, top_k per prompt and seed
BAR = "━"  # rich's bar


def at_a_terminal(argv: list[str], env: dict[str, str], timeout: float = 300) -> tuple[int, str]:
    """Run argv with a 120x40 pseudo-terminal as stdout and stderr; its exit status and every byte it wrote."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, env=env, close_fds=True)
    os.close(follower)
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = os.read(leader, 65536)
        except OSError as err:  # EIO: the child closed the terminal
            if err.errno != errno.EIO:
                raise
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return proc.wait(timeout=60), b"".join(chunks).decode("utf-8", "replace")


def test_run_at_a_terminal_keeps_log_lines_off_the_bar_and_shows_escapes(tmp_path):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(SPEC.format(model=TINY_MODEL, prompts=PROMPTS))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DECODEBENCH_", "COLUMNS", "LINES"))}
    env.update(TERM="xterm-256color", CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1")
    exe = str(Path(sys.executable).with_name("decodebench"))
    rc, raw = at_a_terminal([exe, "--log-level", "info", "run", str(spec), "--out", str(tmp_path / "runs")], env)
    assert rc == 0, raw[-3000:]
    for sequence in ("\x1b[2J", "\x1b]0;", "\x1b]8;", "\x07"):  # clear screen, window title, link, bell
        assert sequence not in raw, (sequence, raw[-3000:])
    assert "tiny\\x1b[2J\\x1b]0;pwned\\x07" in raw  # shown instead
    segments = re.split(r"[\r\n]", raw)  # what each redraw or line of the terminal shows
    logs = [s for s in segments if "job.done" in s]
    assert len(logs) == JOBS, raw[-3000:]  # every job's log line, each on a line of its own ...
    assert not [s for s in segments if BAR in s and "job." in s]  # ... never spliced into the bar
    assert any(BAR in s and f"{JOBS}/{JOBS}" in s for s in segments)  # the bar counted every job
    tail = [s for s in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw).splitlines() if s.strip()]
    assert tail[-4].startswith("report: ") and tail[-3].startswith("open it in a browser")
    assert tail[-2].startswith("next: decodebench report ") and "decodebench rate export" in tail[-1]
