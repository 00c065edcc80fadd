{{/*
decodebench's alerts (metrics.prometheusRule; docs/deploy.md, "Metrics and alerts"), as data: each
one only where its metrics exist, then metrics.prometheusRule.disabled left out, additionalLabels
added and a runbook_url per alert, as kube-prometheus-stack's defaultRules do. Each is exercised by
`promtool test rules` (tests/chart/test_chart_alerts.py). Returns {"rules": [...]}.
*/}}
{{- define "decodebench.alerts" -}}
{{- $m := .Values.metrics }}
{{- $r := $m.prometheusRule }}
{{- $ns := .Release.Namespace }}
{{- $fullname := include "decodebench.fullname" . }}
{{- $workers := printf "namespace=%q, pod=~%q" $ns (printf "%s-worker-.*" $fullname) }}
{{- $server := printf "namespace=%q, service=%q" $ns (include "decodebench.componentName" (dict "root" . "suffix" "server")) }}
{{- $alerts := list }}
{{- if $m.enabled }}
{{- $alerts = append $alerts (dict
  "alert" "DecodebenchQueueStuck"
  "expr" (printf "(max by (namespace, tenant) (decodebench_queue_jobs{%s, state=\"waiting\"}) > 0)\nunless on (namespace, tenant) (max by (namespace, tenant) (decodebench_queue_jobs{%s, state=\"running\"}) > 0)\nunless on (namespace, tenant) (sum by (namespace, tenant) (increase(decodebench_worker_jobs_started_total{%s}[%s])) > 0)\n" $workers $workers $workers $r.stuckFor)
  "for" "5m" "severity" "warning"
  "summary" (printf "decodebench: tenant {{ $labels.tenant }} has jobs waiting and none running or started for %s" $r.stuckFor)
  "description" "Waiting jobs of tenant {{ $labels.tenant }} in {{ $labels.namespace }} are not taken: check `decodebench cluster status`, the workers' logs (job.refused, worker.tenants_reload_failed) and the tenant's max_running.") }}
{{- end }}
{{- $crash := printf "(increase(kube_pod_container_status_restarts_total{%s, container=\"worker\"}[15m]) >= %d)\n" $workers (int $r.crashRestarts) }}
{{- if $m.enabled }}
{{- $crash = printf "(changes(process_start_time_seconds{%s}[15m]) >= %d)\nor\n%s" $workers (int $r.crashRestarts) $crash }}
{{- end }}
{{- $alerts = append $alerts (dict
  "alert" "DecodebenchWorkerCrashLooping" "expr" $crash "for" "5m" "severity" "warning"
  "summary" "decodebench: a worker in {{ $labels.pod }} keeps restarting"
  "description" (printf "A worker process or container restarted %d or more times in 15 minutes: `kubectl logs` shows `process i exited with status …` (a GPU, a driver, a Secret)." (int $r.crashRestarts))) }}
{{- /* A pool KEDA scales, at zero pods while its tenants' jobs of its engine wait: a trigger that fails (ACL, NetworkPolicy, Redis) leaves the ScaledObject inactive and nothing else says so. */}}
{{- $scaled := list }}
{{- range (include "decodebench.pools" . | fromJson).pools }}
{{- if .autoscaling.enabled }}
{{- $scaled = append $scaled .deployment }}
{{- $tenants := list }}{{ range .queues }}{{ $tenants = append $tenants (regexQuoteMeta .) }}{{ end }}
{{- if $m.serverMonitor.enabled }}
{{- $alerts = append $alerts (dict
  "alert" "DecodebenchPoolStuckAtZero"
  "expr" (printf "(max(kube_deployment_spec_replicas{namespace=%q, deployment=%q}) == 0)\nand on ()\n(sum(decodebench_server_queue_jobs{%s, tenant=~%q, engine=%q, state=\"waiting\"}) > 0)\n" $ns .deployment $server (join "|" $tenants) .engine)
  "for" $r.poolAtZeroFor "severity" "critical" "extra" (dict "pool" .name)
  "summary" (printf "decodebench: pool %s stays at zero pods with jobs waiting" .name)
  "description" (printf "KEDA does not scale %s up although its tenants' jobs wait: check the ScaledObject's status (kubectl describe scaledobject %s), KEDA's operator log, its Redis ACL user and the NetworkPolicy admitting it (networkPolicy.kedaNamespace, kedaPodLabels)." .deployment .deployment)) }}
{{- end }}
{{- end }}
{{- end }}
{{- if $scaled }}
{{- $alerts = append $alerts (dict
  "alert" "DecodebenchKedaScalerErrors"
  "expr" (printf "sum by (scaledObject) (increase({__name__=~\"keda_scaled_object_errors(_total)?\", scaledObject=~%q}[10m])) > 0\n" (join "|" $scaled))
  "for" "10m" "severity" "warning"
  "summary" "decodebench: KEDA cannot read the queues of {{ $labels.scaledObject }}"
  "description" "KEDA's Redis triggers of {{ $labels.scaledObject }} keep failing (KEDA's own keda_scaled_object_errors): the pool does not follow its work. Check KEDA's operator log.") }}
{{- end }}
{{- if $m.serverMonitor.enabled }}
{{- $alerts = append $alerts (dict
  "alert" "DecodebenchServerErrors"
  "expr" (printf "sum(rate(decodebench_server_requests_total{%s, code=~\"5..\"}[5m]))\n/ sum(rate(decodebench_server_requests_total{%s}[5m]))\n> %v\n" $server $server $r.serverErrorRatio)
  "for" "10m" "severity" "critical"
  "summary" "decodebench: the submission server answers {{ $value | humanizePercentage }} of requests with 5xx"
  "description" "Tenants' submits and reads fail: 503s are Redis unavailable, 500s a bug (the server's log has server.internal_error with the request id).") }}
{{- $alerts = append $alerts (dict
  "alert" "DecodebenchServerThrottling"
  "expr" (printf "sum(rate(decodebench_server_requests_total{%s, code=\"429\"}[5m]))\n/ sum(rate(decodebench_server_requests_total{%s}[5m]))\n> %v\n" $server $server $r.throttledRatio)
  "for" "15m" "severity" "warning"
  "summary" "decodebench: the submission server refuses {{ $value | humanizePercentage }} of requests with 429"
  "description" "Rate limits or quotas refuse many requests (decodebench_server_quota_refusals_total by tenant): a client in a loop, or a tenant's rate_limit or quota too low.") }}
{{- end }}
{{- if .Values.redis.metrics.enabled }}
{{- $pods := printf "namespace=%q, pod=~%q" $ns (printf "%s-redis-.*" $fullname) }}
{{- $alerts = append $alerts (dict
  "alert" "DecodebenchRedisMemoryHigh"
  "expr" (printf "(redis_memory_used_bytes{%s}\n  / (redis_memory_max_bytes{%s} > 0))\n> %v\n" $pods $pods $r.redisMemoryRatio)
  "for" "10m" "severity" "critical"
  "summary" "decodebench: Redis uses {{ $value | humanizePercentage }} of its maxmemory"
  "description" "At maxmemory Redis refuses writes (noeviction): sweeps cannot be submitted and workers cannot record jobs. Drain or delete old sweeps, or raise redis.resources.limits.memory (maxmemory follows it).") }}
{{- end }}
{{- $rules := list }}
{{- range $alerts }}
{{- $name := .alert }}
{{- if not (get ($r.disabled | default dict) $name) }}
{{- $labels := merge (dict "severity" .severity) (.extra | default dict) ($r.additionalLabels | default dict) }}
{{- $annotations := dict "summary" .summary "description" .description }}
{{- with $r.runbookUrl }}{{ $_ := set $annotations "runbook_url" (printf "%s#%s" (trimSuffix "/" .) (lower $name)) }}{{ end }}
{{- $rules = append $rules (dict "alert" .alert "expr" .expr "for" .for "labels" $labels "annotations" $annotations) }}
{{- end }}
{{- end }}
{{- toJson (dict "rules" $rules) }}
{{- end }}
