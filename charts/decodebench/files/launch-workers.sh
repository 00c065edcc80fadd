#!/bin/bash
# Start one decodebench-worker per device of this pod and supervise them.
#
#   DECODEBENCH_WORKER_PROCESSES  how many processes: the pod's GPUs or MIG slices (1 on a CPU pool)
#   DECODEBENCH_WORKER_DEVICE     cuda (nvidia.com/gpu: whole GPUs, or MIG slices under the device
#                                 plugin's `single` strategy), mig (a MIG profile: `mixed` strategy) or cpu
#   DECODEBENCH_HEARTBEAT_DIR     process i touches <dir>/worker-i on every heartbeat (the probes read them)
#   DECODEBENCH_METRICS_PORT      if set, process i serves Prometheus metrics on this port + i
#   DECODEBENCH_RESTART_BACKOFF   seconds before restarting a crashed process, doubling per crash
#   DECODEBENCH_RESTART_BACKOFF_MAX   the most it waits
#   arguments                     the tenants the pool serves, passed on after --queues
#
# Pinning: the devices the container was given are listed by `nvidia-smi -L` in NVML (PCI bus)
# order; process i gets CUDA_VISIBLE_DEVICES=<UUID of device i> and `--device cuda:0`, so it sees
# exactly one GPU or MIG slice (CUDA enumerates one MIG device per process) and never depends on
# the order in which the device plugin listed them. A GPU listed with MIG devices under it is in
# MIG mode: its slices are the devices, never the GPU itself (the container was given slices,
# whichever way the device plugin advertised them); a GPU without any is a device itself.
#
# Supervision: a process that exits on its own is restarted in place after a backoff (5 s, 10 s,
# ... up to the maximum; reset after 10 minutes of running), while the others keep taking jobs.
# On SIGTERM (scale-down, rollout, eviction) every process is told to stop, this script waits
# until each has finished or requeued its job, and exits 0 if all exited cleanly, else the last
# non-zero status.
set -u

processes="${DECODEBENCH_WORKER_PROCESSES:-1}"
kind="${DECODEBENCH_WORKER_DEVICE:-cuda}"
beats="${DECODEBENCH_HEARTBEAT_DIR:-/tmp/decodebench}"
metrics_port="${DECODEBENCH_METRICS_PORT:-0}"
backoff0="${DECODEBENCH_RESTART_BACKOFF:-5}"
backoff_max="${DECODEBENCH_RESTART_BACKOFF_MAX:-300}"
stopping=0
pids=() uuids=() crashes=() started=() due=()

log() { echo "launch-workers: $*" >&2; }

stop_all() {
  stopping=1
  local pid
  for pid in "${pids[@]}"; do
    [[ -n "${pid}" ]] && kill -TERM "${pid}" 2>/dev/null
  done
}
trap stop_all TERM INT

# The devices in `nvidia-smi -L` (stdin), one UUID a line: each GPU's MIG devices where it lists
# any (indented "MIG <profile> Device N: (UUID: MIG-...)" lines after it), else the GPU itself.
list_devices() {
  local line uuid gpu="" slices=0 re='[(]UUID: ([^)]+)[)]'
  while IFS= read -r line; do
    [[ "${line}" =~ ${re} ]] || continue
    uuid="${BASH_REMATCH[1]}"
    if [[ "${line}" == GPU\ * ]]; then
      ((slices == 0)) && [[ -n "${gpu}" ]] && echo "${gpu}"
      gpu="${uuid}" slices=0
    elif [[ "${line}" =~ ^[[:space:]]*MIG\  ]]; then
      echo "${uuid}"
      slices=$((slices + 1))
    fi
  done
  ((slices == 0)) && [[ -n "${gpu}" ]] && echo "${gpu}"
  return 0
}

if [[ "${kind}" != cpu ]]; then
  mapfile -t uuids < <(nvidia-smi -L 2>/dev/null | list_devices)
  if ((${#uuids[@]} != processes)); then
    log "expected ${processes} ${kind} devices, nvidia-smi -L lists ${#uuids[@]}: check the pool's gpus and gpuResource"
    exit 3
  fi
  whole=0 slices=0
  for uuid in "${uuids[@]}"; do
    if [[ "${uuid}" == MIG-* ]]; then slices=$((slices + 1)); else whole=$((whole + 1)); fi
  done
  if [[ "${kind}" == mig ]] && ((whole > 0)); then
    log "the pool asks for MIG slices (gpuResource nvidia.com/mig-...) but nvidia-smi -L lists ${whole} whole GPU(s)"
    exit 3
  fi
  if [[ "${kind}" == cuda ]] && ((slices > 0)); then
    log "${slices} of ${processes} devices are MIG slices advertised as nvidia.com/gpu (device plugin strategy single)"
  fi
fi
mkdir -p "${beats}"

start() {
  local i=$1 port=0
  ((metrics_port > 0)) && port=$((metrics_port + i))
  if [[ "${kind}" == cpu ]]; then
    DECODEBENCH_HEARTBEAT_FILE="${beats}/worker-${i}" DECODEBENCH_METRICS_PORT="${port}" \
      decodebench-worker --device cpu --queues "${queues[@]}" &
  else
    CUDA_VISIBLE_DEVICES="${uuids[i]}" DECODEBENCH_HEARTBEAT_FILE="${beats}/worker-${i}" DECODEBENCH_METRICS_PORT="${port}" \
      decodebench-worker --device cuda:0 --queues "${queues[@]}" &
  fi
  pids[i]=$!
  started[i]=${SECONDS}
  log "process ${i} started (pid $!, device ${uuids[i]:-cpu})"
}

queues=("$@")
for ((i = 0; i < processes; i++)); do
  crashes[i]=0
  due[i]=0
  start "${i}"
done

status=0
while ((!stopping)); do
  for ((i = 0; i < processes && !stopping; i++)); do
    pid="${pids[i]}"
    if [[ -n "${pid}" ]] && ! kill -0 "${pid}" 2>/dev/null; then
      wait "${pid}"
      code=$?
      ((stopping)) && break
      pids[i]=""
      if ((SECONDS - started[i] > 600)); then crashes[i]=0; fi
      crashes[i]=$((crashes[i] + 1))
      delay=$((backoff0 << (crashes[i] - 1)))
      if ((crashes[i] > 16 || delay > backoff_max)); then delay=${backoff_max}; fi
      due[i]=$((SECONDS + delay))
      log "process ${i} exited with status ${code} (crash ${crashes[i]}); restarting in ${delay}s"
    elif [[ -z "${pid}" ]] && ((SECONDS >= due[i])); then
      start "${i}"
    fi
  done
  ((stopping)) || { sleep 1 & wait $!; }
done

for pid in "${pids[@]}"; do
  [[ -z "${pid}" ]] && continue
  # `wait` returns early when a signal arrives; keep waiting until the process is gone.
  while kill -0 "${pid}" 2>/dev/null; do wait "${pid}"; done
  wait "${pid}" 2>/dev/null
  code=$?
  if ((code != 0 && code != 127)); then status=${code}; fi
done
log "all workers stopped (status ${status})"
exit "${status}"
