#!/bin/bash
# Start one decodebench-worker per device of this pod and supervise them.
#
#   DECODEBENCH_WORKER_PROCESSES  how many processes: the pod's GPU count (1 on a CPU pool)
#   DECODEBENCH_WORKER_DEVICE     cuda: process i runs with --device cuda:i; cpu: --device cpu
#   arguments                     the tenants the pool serves, passed on after --queues
#
# The device plugin hands the container exactly its N GPUs, numbered 0..N-1 inside it
# (CUDA_DEVICE_ORDER=PCI_BUS_ID keeps CUDA and NVML numbering the same), so process i owns
# GPU i. On SIGTERM (scale-down, rollout, eviction) every process is told to stop and this
# script waits until each has finished or requeued its job, within the pod's grace period.
# If one process exits on its own, the others are stopped too and the container exits with
# that status: Kubernetes restarts it and the restart shows in `decodebench cluster status`.
set -u

processes="${DECODEBENCH_WORKER_PROCESSES:-1}"
kind="${DECODEBENCH_WORKER_DEVICE:-cuda}"
pids=()
stopping=0

stop_all() {
  stopping=1
  if ((${#pids[@]})); then
    kill -TERM "${pids[@]}" 2>/dev/null
  fi
}
trap stop_all TERM INT

for ((i = 0; i < processes && !stopping; i++)); do
  if [[ "${kind}" == cpu ]]; then device=cpu; else device="cuda:${i}"; fi
  decodebench-worker --device "${device}" --queues "$@" &
  pids+=("$!")
  echo "launch-workers: decodebench-worker --device ${device} started (pid $!)" >&2
done

# Returns when the first process exits, or early when a signal runs stop_all.
wait -n
status=$?
if ((!stopping)); then
  echo "launch-workers: a worker exited with status ${status}; stopping the others" >&2
  stop_all
else
  status=0
fi
for pid in "${pids[@]}"; do
  # `wait` returns early when a signal arrives; keep waiting until the process is gone.
  while kill -0 "${pid}" 2>/dev/null; do wait "${pid}"; done
done
echo "launch-workers: all workers stopped" >&2
exit "${status}"
