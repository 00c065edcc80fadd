{{/*
Names. Kubernetes names and label values stop at 63 characters.
*/}}
{{- define "decodebench.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "decodebench.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* A component's resource name: <fullname>-<suffix> in 63 characters; the prefix gives way, never the suffix. */}}
{{- define "decodebench.componentName" -}}
{{- $prefix := include "decodebench.fullname" .root | trunc (int (sub 62 (len .suffix))) | trimSuffix "-" }}
{{- printf "%s-%s" $prefix .suffix }}
{{- end }}

{{- define "decodebench.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels every object's metadata carries (pod templates: decodebench.podLabels). */}}
{{- define "decodebench.labels" -}}
helm.sh/chart: {{ include "decodebench.chart" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{ include "decodebench.podLabels" . }}
{{- end }}

{{/*
Labels of pod templates: no chart or app version, so that a chart upgrade rolls only the pods
whose spec changed (a new image, new settings), not every GPU pool and Redis. commonLabels
(values) go everywhere; they cannot replace the chart's own.
*/}}
{{- define "decodebench.podLabels" -}}
{{ include "decodebench.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: decodebench
{{- include "decodebench.stringMap" (omit (.Values.commonLabels | default dict) "helm.sh/chart" "app.kubernetes.io/version" "app.kubernetes.io/name" "app.kubernetes.io/instance" "app.kubernetes.io/managed-by" "app.kubernetes.io/part-of" "app.kubernetes.io/component") }}
{{- end }}

{{/* The checksum of what a pod reads from a ConfigMap of this chart: its `data`, not its labels. Args: {root, template}. */}}
{{- define "decodebench.dataChecksum" -}}
{{- (include (print .root.Template.BasePath "/" .template) .root | fromYaml).data | toJson | sha256sum }}
{{- end }}

{{/*
The generated Redis password (base64), the same in every template of one render: the one the
cluster holds (lookup, on install/upgrade), else a new random one, kept in .Values for the render.
*/}}
{{- define "decodebench.generatedRedisPassword" -}}
{{- if not (hasKey .Values "__generatedRedisPassword") }}
{{- $name := include "decodebench.componentName" (dict "root" . "suffix" "redis") }}
{{- $key := .Values.redis.auth.passwordKey }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace $name }}
{{- $password := randAlphaNum 32 | b64enc }}
{{- if and $existing $existing.data (hasKey $existing.data $key) }}
{{- $password = index $existing.data $key }}
{{- end }}
{{- $_ := set .Values "__generatedRedisPassword" $password }}
{{- end }}
{{- get .Values "__generatedRedisPassword" }}
{{- end }}

{{/* Labels that select this release's pods; the NetworkPolicy admits exactly these to Redis. */}}
{{- define "decodebench.selectorLabels" -}}
app.kubernetes.io/name: {{ include "decodebench.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
image reference: repository:tag[@digest]; tag defaults to the chart's appVersion. Args: {root, image}.
global.imageRegistry replaces the repository's registry (its first part when that names a host:
has a '.' or ':' or is localhost), as a mirror keeping the paths expects (docker.io/library/redis
-> mirror.example/library/redis).
*/}}
{{- define "decodebench.image" -}}
{{- $tag := default .root.Chart.AppVersion .image.tag }}
{{- $repo := .image.repository }}
{{- with (.root.Values.global | default dict).imageRegistry }}
{{- $parts := splitList "/" $repo }}
{{- $host := first $parts }}
{{- if and (gt (len $parts) 1) (or (contains "." $host) (contains ":" $host) (eq $host "localhost")) }}
{{- $repo = rest $parts | join "/" }}
{{- end }}
{{- $repo = printf "%s/%s" (trimSuffix "/" .) $repo }}
{{- end }}
{{- if .image.digest }}
{{- printf "%s:%s@%s" $repo $tag .image.digest }}
{{- else }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}
{{- end }}

{{/* A pod's imagePullSecrets: global.imagePullSecrets (names or {name}) and imagePullSecrets, once each. Args: root. */}}
{{- define "decodebench.imagePullSecrets" -}}
{{- $names := list }}
{{- range concat ((.Values.global | default dict).imagePullSecrets | default list) (.Values.imagePullSecrets | default list) }}
{{- if kindIs "string" . }}{{ $names = append $names . }}{{ else }}{{ $names = append $names .name }}{{ end }}
{{- end }}
{{- with uniq $names }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/* The ServiceAccount of a component's pods (serviceAccount.create/name). Args: {root, component}. */}}
{{- define "decodebench.serviceAccountName" -}}
{{- $sa := (index .root.Values .component).serviceAccount }}
{{- if $sa.create }}
{{- default (include "decodebench.componentName" (dict "root" .root "suffix" .component)) $sa.name }}
{{- else }}
{{- default "default" $sa.name }}
{{- end }}
{{- end }}

{{/*
Redis connection, the same for the in-cluster StatefulSet and an external Redis:
a dict {scheme, host, port, db, secretName, secretKey}; secretName is empty when there is no password.
*/}}
{{- define "decodebench.redis" -}}
{{- $r := .Values.redis }}
{{- $out := dict "secretKey" $r.auth.passwordKey }}
{{- if $r.enabled }}
{{- $_ := set $out "scheme" "redis" }}
{{- $_ := set $out "host" (printf "%s.%s.svc" (include "decodebench.componentName" (dict "root" . "suffix" "redis")) .Release.Namespace) }}
{{- $_ := set $out "port" "6379" }}
{{- $_ := set $out "db" "0" }}
{{- $_ := set $out "secretName" (default (include "decodebench.componentName" (dict "root" . "suffix" "redis")) $r.auth.existingSecret) }}
{{- else }}
{{- $u := urlParse $r.external.url }}
{{- $hostport := splitList ":" $u.host }}
{{- $_ := set $out "scheme" $u.scheme }}
{{- $_ := set $out "host" (first $hostport) }}
{{- $_ := set $out "port" (ternary (last $hostport) "6379" (eq (len $hostport) 2)) }}
{{- $_ := set $out "db" (default "0" (trimPrefix "/" $u.path)) }}
{{- $_ := set $out "secretName" $r.auth.existingSecret }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/* Whether the values declare tenants (a tenants file, Redis ACL users). */}}
{{- define "decodebench.tenantsOn" -}}
{{- if and .Values.tenants .Values.tenants.tenants }}true{{ end }}
{{- end }}

{{/*
Who a program logs in to Redis as: {user, secretName, secretKey}. Args: {root, role}; role is
server, worker, keda or exporter, each with tenants its ACL user (tenants hold no Redis user).
Without tenants: no user, the one Redis password (secretName empty when there is none).
*/}}
{{- define "decodebench.redisLogin" -}}
{{- $root := .root }}
{{- $redis := include "decodebench.redis" $root | fromJson }}
{{- $out := dict "user" "" "secretName" $redis.secretName "secretKey" $redis.secretKey }}
{{- if include "decodebench.tenantsOn" $root }}
{{- $_ := set $out "secretKey" "password" }}
{{- $_ := set $out "user" .role }}
{{- $_ := set $out "secretName" (dig .role "secret" "" $root.Values.tenants) }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/* Secrets of the submission server: {tokens, signing} names (existing or generated). */}}
{{- define "decodebench.serverSecrets" -}}
{{- $tokens := default (include "decodebench.componentName" (dict "root" . "suffix" "server-tokens")) .Values.server.tokens.existingSecret }}
{{- $signing := default (include "decodebench.componentName" (dict "root" . "suffix" "signing-key")) .Values.signingKey.existingSecret }}
{{- toJson (dict "tokens" $tokens "signing" $signing "service" (include "decodebench.componentName" (dict "root" . "suffix" "server"))) }}
{{- end }}

{{/* The signing key as a file (DECODEBENCH_SIGNING_KEY_FILE) of the server and the workers: volume, or with mount=true its mount. */}}
{{- define "decodebench.signingKeyVolume" -}}
{{- if .mount }}
- name: signing-key
  mountPath: /etc/decodebench-signing
  readOnly: true
{{- else }}
- name: signing-key
  secret:
    secretName: {{ (include "decodebench.serverSecrets" .root | fromJson).signing }}
    defaultMode: 0440
    items:
      - key: key
        path: key
{{- end }}
{{- end }}

{{/* The Redis password as a file (DECODEBENCH_REDIS_PASSWORD_FILE), and a rediss:// Redis's CA bundle (DECODEBENCH_REDIS_CA_FILE): the pod's volumes. Args: {root, role}. */}}
{{- define "decodebench.redisPasswordVolume" -}}
{{- $login := include "decodebench.redisLogin" . | fromJson }}
{{- if $login.secretName }}
- name: redis-password
  secret:
    secretName: {{ $login.secretName }}
    defaultMode: 0440
    items:
      - key: {{ $login.secretKey }}
        path: password
{{- end }}
{{- include "decodebench.redisCaVolume" .root }}
{{- end }}

{{/* ... and its mount. Args: {root, role}. */}}
{{- define "decodebench.redisPasswordMount" -}}
{{- $login := include "decodebench.redisLogin" . | fromJson }}
{{- if $login.secretName }}
- name: redis-password
  mountPath: /run/secrets/decodebench-redis
  readOnly: true
{{- end }}
{{- include "decodebench.redisCaMount" .root }}
{{- end }}

{{/*
Environment of every decodebench program. Args: {root, role}; role is server, worker or
controller. The server and the workers log in to Redis (the URL names the ACL user with tenants
but holds no password: the program reads it from the Secret mounted as a file,
DECODEBENCH_REDIS_PASSWORD_FILE) and read the signing key from a file; the controller holds no
Redis credentials and talks to the server with its token file. signing=false (helm test pods):
no signing key.
*/}}
{{- define "decodebench.env" -}}
{{- $role := .role }}
{{- $signing := ternary .signing true (hasKey . "signing") }}
{{- $root := .root }}
{{- with .root }}
{{- if eq $role "controller" }}
- name: DECODEBENCH_API_URL
  value: {{ include "decodebench.apiUrl" . | quote }}
- name: DECODEBENCH_TOKEN_FILE
  value: /run/secrets/decodebench-token/token
{{- if include "decodebench.serverCaOn" . }}
- name: DECODEBENCH_CA_BUNDLE
  value: /etc/decodebench-server-ca/ca.crt
{{- end }}
{{- else }}
{{- $redis := include "decodebench.redis" . | fromJson }}
{{- $login := include "decodebench.redisLogin" (dict "root" . "role" $role) | fromJson }}
- name: DECODEBENCH_REDIS_URL
  value: {{ printf "%s://%s%s:%s/%s" $redis.scheme (ternary (printf "%s@" $login.user) "" (ne $login.user "")) $redis.host $redis.port $redis.db | quote }}
{{- if $login.secretName }}
- name: DECODEBENCH_REDIS_PASSWORD_FILE
  value: /run/secrets/decodebench-redis/password
{{- end }}
{{- if include "decodebench.redisCaOn" . }}
- name: DECODEBENCH_REDIS_CA_FILE
  value: /etc/decodebench-redis-ca/ca.crt
{{- end }}
{{- if $signing }}
- name: DECODEBENCH_SIGNING_KEY_FILE
  value: /etc/decodebench-signing/key
{{- end }}
{{- if include "decodebench.tenantsOn" . }}
- name: DECODEBENCH_TENANTS_FILE
  value: /etc/decodebench/tenants.yaml
{{- end }}
{{- end }}
- name: DECODEBENCH_STORE
  value: {{ printf "s3://%s/%s" .Values.store.bucket .Values.store.prefix | trimSuffix "/" | quote }}
{{- with .Values.store.endpointUrl }}
- name: DECODEBENCH_S3_ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
- name: AWS_REGION
  value: {{ .Values.store.region | quote }}
{{- with .Values.store.existingSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $root.Values.store.accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $root.Values.store.secretAccessKeyKey }}
{{- end }}
- name: DECODEBENCH_TENANT
  value: {{ .Values.tenant | quote }}
{{- with .Values.networkPolicy.egress.proxy }}{{ if .url }}
{{- $direct := list ".svc" ".cluster.local" "localhost" "127.0.0.1" }}
{{- with $root.Values.store.endpointUrl }}{{ $direct = append $direct (splitList ":" (urlParse .).host | first) }}{{ end }}
# S3 and the Hugging Face Hub through the egress proxy (networkPolicy.egress.proxy).
- name: HTTPS_PROXY
  value: {{ .url | quote }}
- name: HTTP_PROXY
  value: {{ .url | quote }}
- name: NO_PROXY
  value: {{ concat $direct (.noProxy | default list) | uniq | join "," | quote }}
{{- end }}{{ end }}
- name: DECODEBENCH_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
- name: DECODEBENCH_JOB_TIMEOUT
  value: {{ .Values.worker.jobTimeoutSeconds | quote }}
- name: HOME
  value: /tmp
- name: PYTHONDONTWRITEBYTECODE
  value: "1"
# Provenance: every result records the pod and node it ran on.
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- end }}
{{- end }}

{{/*
Where a pod runs: priority, runtime class, scheduler, node selector, tolerations, affinity and
topology spread, passed through from a values map (a pool, redis or controller). Args: the map.
*/}}
{{- define "decodebench.podPlacement" -}}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with .schedulerName }}
schedulerName: {{ . }}
{{- end }}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* A pod's own labels and annotations from the values (null values dropped). Args: {labels|annotations map}. */}}
{{- define "decodebench.stringMap" -}}
{{- range $k, $v := . }}
{{- if not (kindIs "invalid" $v) }}
{{ $k }}: {{ $v | toString | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A Kubernetes memory quantity in bytes (integers with an optional k/M/G/T/Ki/Mi/Gi/Ti suffix); 0 if empty.
*/}}
{{- define "decodebench.bytes" -}}
{{- $q := toString (default "0" .) }}
{{- $num := regexFind "^[0-9.]+" $q }}
{{- $unit := trimPrefix $num $q }}
{{- $mult := dict "" 1 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 }}
{{- if not (hasKey $mult $unit) }}
{{- fail (printf "cannot read the memory quantity %q (use e.g. 2Gi or 2048Mi)" $q) }}
{{- end }}
{{- mulf (float64 $num) (get $mult $unit) | int64 }}
{{- end }}

{{/* Redis's maxmemory in bytes: redis.maxmemory, or 75% of the container's memory limit; 0: none set. */}}
{{- define "decodebench.redisMaxmemory" -}}
{{- $r := .Values.redis }}
{{- $limit := include "decodebench.bytes" (dig "limits" "memory" "" $r.resources) | int64 }}
{{- if $r.maxmemory }}
{{- $m := $r.maxmemory | lower }}
{{- $num := regexFind "^[0-9]+" $m }}
{{- $unit := trimPrefix $num $m }}
{{- $bytes := mul (int64 $num) (get (dict "" 1 "b" 1 "kb" 1024 "mb" 1048576 "gb" 1073741824) $unit) }}
{{- if and $limit (ge $bytes $limit) }}
{{- fail (printf "redis.maxmemory (%s) must stay below redis.resources.limits.memory (%s), or Redis is OOM-killed before it refuses writes" $r.maxmemory (toString $r.resources.limits.memory)) }}
{{- end }}
{{- $bytes }}
{{- else }}
{{- div (mul $limit 3) 4 }}
{{- end }}
{{- end }}

{{/*
The pools, each merged over worker.poolDefaults: a key set in a pool replaces the default
as a whole, except `image` and `autoscaling`, merged key by key. Returns {"pools": [...]}.
*/}}
{{/* The most worker processes a pod of any pool runs (its metrics ports are port .. port + this - 1). */}}
{{- define "decodebench.maxProcesses" -}}
{{- $most := 1 }}
{{- range (include "decodebench.pools" . | fromJson).pools }}{{ $most = max $most (int .gpus) }}{{ end }}
{{- $most }}
{{- end }}

{{- define "decodebench.pools" -}}
{{- $pools := list }}
{{- range $i, $pool := .Values.worker.pools }}
{{- $merged := deepCopy $.Values.worker.poolDefaults }}
{{- range $key, $value := $pool }}
{{- if and (has $key (list "image" "autoscaling" "podLabels" "podAnnotations" "podDisruptionBudget")) (kindIs "map" $value) }}
{{- $sub := deepCopy (get $merged $key | default dict) }}
{{- range $k, $v := $value }}{{ if kindIs "invalid" $v }}{{ $_ := unset $sub $k }}{{ else }}{{ $_ := set $sub $k $v }}{{ end }}{{ end }}
{{- $_ := set $merged $key $sub }}
{{- else }}
{{- $_ := set $merged $key $value }}
{{- end }}
{{- end }}
{{- /* A pool's image keys left empty fall back to worker.image (worker.vllmImage for a vLLM pool). */}}
{{- $image := deepCopy (ternary $.Values.worker.vllmImage $.Values.worker.image (eq $merged.engine "vllm")) }}
{{- range $k, $v := $merged.image }}{{ if $v }}{{ $_ := set $image $k $v }}{{ end }}{{ end }}
{{- $_ := set $merged "image" $image }}
{{- /* A CPU pool carries no GPU toleration: it must not land on (and hold) a GPU node. */}}
{{- if eq (int $merged.gpus) 0 }}
{{- $tolerations := list }}
{{- range $merged.tolerations }}{{ if not (hasPrefix "nvidia.com/" (.key | default "")) }}{{ $tolerations = append $tolerations . }}{{ end }}{{ end }}
{{- $_ := set $merged "tolerations" $tolerations }}
{{- end }}
{{- /* KEDA's target per pod: jobsPerReplica, else the pod's worker processes (one per GPU, one on CPU). */}}
{{- if not $merged.autoscaling.jobsPerReplica }}
{{- $_ := set $merged.autoscaling "jobsPerReplica" (max (int $merged.gpus) 1) }}
{{- end }}
{{- $_ := set $merged "mig" (hasPrefix "nvidia.com/mig-" $merged.gpuResource) }}
{{- /* The suffix of the pool's RQ queue names: none for the own engine, .<engine> for another (worker/core/keys.py). */}}
{{- $_ := set $merged "queueSuffix" (ternary "" (printf ".%s" $merged.engine) (eq $merged.engine "decodebench")) }}
{{- $_ := set $merged "index" $i }}
{{- $_ := set $merged "deployment" (include "decodebench.componentName" (dict "root" $ "suffix" (printf "worker-%s" $pool.name))) }}
{{- $pools = append $pools $merged }}
{{- end }}
{{- toJson (dict "pools" $pools) }}
{{- end }}

{{/* Combinations the schema cannot express, each failing with a message that names the values. */}}
{{- define "decodebench.validate" -}}
{{- $r := .Values.redis }}
{{- if and $r.enabled $r.external.url }}
{{- fail "redis: set either redis.enabled=true (Redis in the cluster) or redis.external.url (your own Redis), not both" }}
{{- end }}
{{- if and (not $r.enabled) (not $r.external.url) }}
{{- fail "redis: set redis.enabled=true (Redis in the cluster) or redis.external.url=redis://host:6379/0 (your own Redis)" }}
{{- end }}
{{- if and $r.enabled (eq (include "decodebench.redisMaxmemory" . | int64) 0) }}
{{- fail "redis: set redis.resources.limits.memory (or redis.maxmemory below it): without maxmemory a full Redis is OOM-killed instead of refusing writes" }}
{{- end }}
{{- include "decodebench.validateTenants" . }}
{{- include "decodebench.validateReportWorkers" . }}
{{- include "decodebench.validatePlatform" . }}
{{- $proxy := .Values.networkPolicy.egress.proxy }}
{{- if and .Values.networkPolicy.enabled $proxy.url (not $proxy.to) }}
{{- fail "networkPolicy.egress.proxy: set `to` (the proxy's NetworkPolicy peers) with `url`: S3 and the Hub are reached through the proxy only" }}
{{- end }}
{{- $seen := dict }}
{{- range (include "decodebench.pools" . | fromJson).pools }}
{{- if hasKey $seen .name }}
{{- fail (printf "worker.pools: the pool name %q appears twice; pool names must be unique" .name) }}
{{- end }}
{{- $_ := set $seen .name true }}
{{- if and (eq .name "report-workers") $.Values.reportWorkers.enabled }}
{{- fail "worker.pools: the pool name \"report-workers\" is the report workers' (reportWorkers) in `decodebench cluster`; rename the pool" }}
{{- end }}
{{- if .autoscaling.enabled }}
{{- if has "*" .queues }}
{{- fail (printf "worker.pools[%d] (%s): autoscaling watches named queues, so `queues` must list tenants, not \"*\"" (int .index) .name) }}
{{- end }}
{{- if gt (int .autoscaling.minReplicas) (int .autoscaling.maxReplicas) }}
{{- fail (printf "worker.pools[%d] (%s): autoscaling.minReplicas (%d) is above autoscaling.maxReplicas (%d)" (int .index) .name (int .autoscaling.minReplicas) (int .autoscaling.maxReplicas)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Tenants hold no Redis credentials; every service user's password comes from a Secret, under a variable of its own. */}}
{{- define "decodebench.validateTenants" -}}
{{- if include "decodebench.tenantsOn" . }}
{{- $t := .Values.tenants }}
{{- $vars := dict }}
{{- range $i, $tenant := $t.tenants }}
{{- if hasKey . "redis_password_env" }}
{{- fail (printf "tenants.tenants[%d].redis_password_env: tenants hold no Redis credentials (the submission server is their only door); remove it" $i) }}
{{- end }}
{{- if dig "secrets" "redis" "" . }}
{{- fail (printf "tenants.tenants[%d].secrets.redis: tenants hold no Redis credentials (the submission server is their only door); remove it" $i) }}
{{- end }}
{{- end }}
{{- range $who := include "decodebench.redisUsers" . | fromJsonArray }}
{{- $s := index $t $who | default dict }}
{{- if not (and $s.redis_password_env $s.secret) }}
{{- fail (printf "tenants.%s: set tenants.%s.secret (a Secret with key `password`) and tenants.%s.redis_password_env: with tenants, the %s Redis user has a password of its own" $who $who $who $who) }}
{{- end }}
{{- if hasKey $vars $s.redis_password_env }}
{{- fail (printf "tenants.%s.redis_password_env: %s is already the variable of %s; each password needs a variable of its own" $who $s.redis_password_env (get $vars $s.redis_password_env)) }}
{{- end }}
{{- $_ := set $vars $s.redis_password_env $who }}
{{- end }}
{{- if not .Values.server.tokens.existingSecret }}
{{- fail "server.tokens.existingSecret: with tenants, create a Secret with key tokens.yaml (a token per tenant, docs/deploy.md) and name it here; the generated token is for a single team without tenants" }}
{{- end }}
{{- if and .Values.controller.enabled (not .Values.controller.tokenSecret) }}
{{- fail "controller.tokenSecret: with tenants, name a Secret (key `token`) holding the controller pod's token for the server, or set controller.enabled=false" }}
{{- end }}
{{- $names := list }}{{ range $t.tenants }}{{ $names = append $names .name }}{{ end }}
{{- include "decodebench.validateJudges" $t }}
{{- if and .Values.controller.enabled (not (has .Values.tenant $names)) }}
{{- fail (printf "tenant: the controller pod submits as `tenant` (%s), which must be one of tenants.tenants (%s)" .Values.tenant (join ", " $names)) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The Redis users the deployment has with tenants: server and worker, keda when a pool or the report workers autoscale, exporter with metrics. */}}
{{- define "decodebench.redisUsers" -}}
{{- $users := list "server" "worker" }}
{{- if include "decodebench.kedaOn" . }}{{ $users = append $users "keda" }}{{ end }}
{{- if .Values.redis.metrics.enabled }}{{ $users = append $users "exporter" }}{{ end }}
{{- toJson $users }}
{{- end }}

{{/* The writable /tmp every pod mounts on its read-only root. Args: {size}. */}}
{{- define "decodebench.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .size }}
{{- end }}

{{/* Whether KEDA scales anything: a pool, or the report workers. */}}
{{- define "decodebench.kedaOn" -}}
{{- $on := and .Values.reportWorkers.enabled .Values.reportWorkers.autoscaling.enabled }}
{{- range (include "decodebench.pools" . | fromJson).pools }}{{ if .autoscaling.enabled }}{{ $on = true }}{{ end }}{{ end }}
{{- if $on }}true{{ end }}
{{- end }}

{{/* The report workers' image: reportWorkers.image's keys set, else controller.image's. */}}
{{- define "decodebench.reportWorkerImage" -}}
{{- $image := deepCopy .Values.controller.image }}
{{- range $k, $v := .Values.reportWorkers.image }}{{ if $v }}{{ $_ := set $image $k $v }}{{ end }}{{ end }}
{{- toJson $image }}
{{- end }}

{{/* Autoscaled report workers watch named queues, as autoscaled pools do; with tenants, `decodebench
report-worker` refuses at start a tenant the tenants file does not declare: refused here instead of a crash loop. */}}
{{- define "decodebench.validateReportWorkers" -}}
{{- $rw := .Values.reportWorkers }}
{{- if and $rw.enabled (include "decodebench.tenantsOn" .) }}
{{- $names := list }}{{ range .Values.tenants.tenants }}{{ $names = append $names .name }}{{ end }}
{{- range $rw.queues }}
{{- if and (ne . "*") (not (has . $names)) }}
{{- fail (printf "reportWorkers.queues: tenant %q is not in tenants.tenants (%s); a report worker takes declared tenants only" . (join ", " $names)) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and $rw.enabled $rw.autoscaling.enabled }}
{{- if has "*" $rw.queues }}
{{- fail "reportWorkers: autoscaling watches named queues, so `queues` must list tenants, not \"*\"" }}
{{- end }}
{{- if gt (int $rw.autoscaling.minReplicas) (int $rw.autoscaling.maxReplicas) }}
{{- fail (printf "reportWorkers: autoscaling.minReplicas (%d) is above autoscaling.maxReplicas (%d)" (int $rw.autoscaling.minReplicas) (int $rw.autoscaling.maxReplicas)) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The judge endpoints' keys (tenants.judges[].secret), each Secret mounted read-only at the directory of
its api_key_file, the key under the file's name: in the report workers only, the operator's pods that
send judge requests (docs/judge.md). Never in the controller pod, which a tenant may exec into.
Args: {root, mount}: mount=true the volumeMounts, else the volumes.
*/}}
{{- define "decodebench.judgeKeys" -}}
{{- if include "decodebench.tenantsOn" .root }}
{{- range $i, $j := .root.Values.tenants.judges | default list }}
{{- if $j.secret }}
{{- if $.mount }}
- name: judge-key-{{ $i }}
  mountPath: {{ dir $j.api_key_file }}
  readOnly: true
{{- else }}
- name: judge-key-{{ $i }}
  secret:
    secretName: {{ $j.secret }}
    items:
      - key: {{ base $j.api_key_file }}
        path: {{ base $j.api_key_file }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Judge endpoints: unique names, those the tenants name declared, each key a Secret in a directory of its own. */}}
{{- define "decodebench.validateJudges" -}}
{{- $declared := list }}{{ $dirs := dict }}
{{- range $i, $j := .judges | default list }}
{{- if has $j.name $declared }}
{{- fail (printf "tenants.judges[%d].name: %s is declared twice" $i $j.name) }}
{{- end }}
{{- $declared = append $declared $j.name }}
{{- if not (and $j.secret $j.api_key_file) }}
{{- if or $j.secret $j.api_key_file }}
{{- fail (printf "tenants.judges[%d] (%s): set both secret (a Secret holding the key) and api_key_file (where the report workers read it), or neither for an endpoint without a key" $i $j.name) }}
{{- end }}
{{- else }}
{{- $dir := dir $j.api_key_file }}
{{- if hasKey $dirs $dir }}
{{- fail (printf "tenants.judges[%d].api_key_file: %s is already the directory of %s's key; each key needs a directory of its own" $i $dir (get $dirs $dir)) }}
{{- end }}
{{- if or (eq $dir "/") (has $dir (list "/etc/decodebench" "/tmp" "/etc" "/run" "/run/secrets")) }}
{{- fail (printf "tenants.judges[%d].api_key_file: %s would be mounted over %s; use a directory of its own, e.g. /secrets/judge-%s/key" $i $j.api_key_file $dir $j.name) }}
{{- end }}
{{- $_ := set $dirs $dir $j.name }}
{{- end }}
{{- end }}
{{- range $i, $tenant := .tenants }}
{{- range $tenant.judges | default list }}
{{- if not (has . $declared) }}
{{- fail (printf "tenants.tenants[%d].judges: %s is not a declared judge endpoint (tenants.judges)" $i .) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
