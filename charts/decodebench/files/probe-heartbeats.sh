# Probe of a worker pod: are its decodebench-worker processes beating?
#   $1 = all: every process touched its heartbeat file within DECODEBENCH_HEARTBEAT_TTL seconds (readiness)
#   $1 = any: at least one did (liveness: one crash-looping GPU must not restart the others)
dir="${DECODEBENCH_HEARTBEAT_DIR:-/tmp/decodebench}"
# the TTL as whole seconds: the worker takes any float (90.5, 1e2), bash arithmetic only integers
printf -v ttl '%.0f' "${DECODEBENCH_HEARTBEAT_TTL:-60}" 2>/dev/null || ttl=60
n="${DECODEBENCH_WORKER_PROCESSES:-1}"
now=$(date +%s)
fresh=0
for ((i = 0; i < n; i++)); do
  beat=$(stat -c %Y "${dir}/worker-${i}" 2>/dev/null) || continue
  if ((now - beat < ttl)); then fresh=$((fresh + 1)); fi
done
echo "${fresh}/${n} worker processes beating"
if [[ "$1" == all ]]; then ((fresh == n)); else ((fresh > 0)); fi
