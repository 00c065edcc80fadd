"""Stopping promptly: an idle worker leaves within a second or two of SIGTERM, and says so.

Two things kept an idle RQ worker up to a minute after SIGTERM:

- the kernel may hand a process-directed signal to any thread that does not block it; landed in
  a helper thread, Python runs the handler only when the main thread next executes bytecode, that
  is when its blocking pop in Redis times out (up to the reaper interval). The helper threads are
  started with the stop signals blocked, so SIGTERM always interrupts the main thread's pop;
- RQ's `unsubscribe` stops its pubsub listener with redis-py's `stop()`, which waits for the
  listener's read of up to 60 s to end. Here the listener is told to stop before the UNSUBSCRIBE,
  whose reply wakes it, and waited for a second at most (it is a daemon thread).

Last, one `worker.stopped` line: jobs run and failed, and uptime."""

from __future__ import annotations

import signal
import time

import structlog

log = structlog.get_logger("decodebench.worker")
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1}  # SIGUSR1: worker.INTERRUPT_SIGNAL


class StopPromptly:
    """A mixin before RQ's worker class in the bases."""

    _born: float | None = None
    _jobs_ok = 0
    _jobs_failed = 0

    def increment_successful_job_count(self, pipeline=None) -> None:  # RQ counts in Redis only
        self._jobs_ok += 1
        super().increment_successful_job_count(pipeline)

    def increment_failed_job_count(self, pipeline=None) -> None:
        self._jobs_failed += 1
        super().increment_failed_job_count(pipeline)

    def bootstrap(self, *args, **kwargs) -> None:
        self._born = time.monotonic()
        old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:  # threads started here (RQ's pubsub listener) inherit the mask
            super().bootstrap(*args, **kwargs)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def unsubscribe(self) -> None:
        thread = getattr(self, "pubsub_thread", None)
        if not thread:
            return
        thread.stop(timeout=0)  # clears its flag, does not wait
        try:
            self.pubsub.unsubscribe()  # the reply wakes the listener, which closes the pubsub
        except Exception as err:  # Redis gone: the daemon thread dies with the process
            log.warning("worker.unsubscribe_failed", error=str(err))
        thread.join(timeout=1)

    def teardown(self) -> None:
        super().teardown()
        uptime = 0.0 if self._born is None else time.monotonic() - self._born
        ok, failed = self._jobs_ok, self._jobs_failed
        log.info("worker.stopped", name=self.name, jobs_run=ok + failed, jobs_failed=failed, uptime_s=round(uptime, 1))
