{{/*
Guardrails checked at render time (docs/deploy.md, "Guardrails"): GitOps mode, the kinds the cluster
serves, and monitoring that NetworkPolicies would silently block. Each fails in one line naming the
values to change. Called from decodebench.validate.
*/}}
{{- define "decodebench.validatePlatform" -}}
{{- include "decodebench.validateGitops" . }}
{{- include "decodebench.validateCapabilities" . }}
{{- include "decodebench.validateScrape" . }}
{{- /* The generated token acts for tenant `default`: a controller pod told another tenant would submit to default's queues. */}}
{{- if and .Values.controller.enabled (not .Values.controller.tokenSecret) (not (include "decodebench.tenantsOn" .)) (ne .Values.tenant "default") }}
{{- fail (printf "tenant: the controller pod's generated token acts for tenant `default`, not %q; set controller.tokenSecret to a Secret holding a token of %s (docs/deploy.md, section 5b), or leave tenant at default" .Values.tenant .Values.tenant) }}
{{- end }}
{{- end }}

{{/*
GitOps mode: nothing random and no lookup in a render. Every Secret the chart would otherwise
generate (randAlphaNum, a new one each `helm template`: a new signing key, token and Redis password
at every Argo CD or Flux sync) must be an existing one.
*/}}
{{- define "decodebench.validateGitops" -}}
{{- if .Values.gitops }}
{{- $missing := list }}
{{- if not .Values.signingKey.existingSecret }}{{ $missing = append $missing "signingKey.existingSecret" }}{{ end }}
{{- if not .Values.server.tokens.existingSecret }}{{ $missing = append $missing "server.tokens.existingSecret" }}{{ end }}
{{- if and .Values.redis.enabled (not .Values.redis.auth.existingSecret) (not (include "decodebench.tenantsOn" .)) }}{{ $missing = append $missing "redis.auth.existingSecret" }}{{ end }}
{{- if and .Values.controller.enabled (not .Values.controller.tokenSecret) }}{{ $missing = append $missing "controller.tokenSecret" }}{{ end }}
{{- with $missing }}
{{- fail (printf "gitops: every Secret must be an existing one (a render generates none); set %s" (join ", " .)) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The Secret (key `token`) of the helm test pod that goes through the server; empty in GitOps mode without one. */}}
{{- define "decodebench.helmTestTokenSecret" -}}
{{- $t := .Values.helmTest.tokenSecret | default .Values.controller.tokenSecret }}
{{- if and (not $t) (not .Values.gitops) (not .Values.server.tokens.existingSecret) }}
{{- $t = (include "decodebench.serverSecrets" . | fromJson).tokens }}
{{- end }}
{{- $t }}
{{- end }}

{{/*
KEDA's and prometheus-operator's kinds are CRDs: an install without them fails half-way (or, with
Argo CD, stays out of sync). Checked against what the cluster serves (.Capabilities); `helm lint`
cannot know it (capabilityCheck=false there), `helm template` learns it from --api-versions.
*/}}
{{- define "decodebench.validateCapabilities" -}}
{{- if .Values.capabilityCheck }}
{{- $need := dict }}
{{- if include "decodebench.kedaOn" . }}
{{- $_ := set $need "keda.sh/v1alpha1/ScaledObject" "KEDA (>= 2.13, its CRDs)" }}
{{- end }}
{{- $m := .Values.metrics }}
{{- if $m.podMonitor.enabled }}{{ $_ := set $need "monitoring.coreos.com/v1/PodMonitor" "prometheus-operator's CRDs" }}{{ end }}
{{- if or $m.serviceMonitor.enabled $m.serverMonitor.enabled }}{{ $_ := set $need "monitoring.coreos.com/v1/ServiceMonitor" "prometheus-operator's CRDs" }}{{ end }}
{{- if $m.prometheusRule.enabled }}{{ $_ := set $need "monitoring.coreos.com/v1/PrometheusRule" "prometheus-operator's CRDs" }}{{ end }}
{{- range $kind := keys $need | sortAlpha }}
{{- if not ($.Capabilities.APIVersions.Has $kind) }}
{{- fail (printf "%s is not served by this cluster: install %s first (helm template: --api-versions %s; helm lint: --set capabilityCheck=false)" $kind (get $need $kind) $kind) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A monitor whose scrape the release's own NetworkPolicies would drop: no metrics, so no alert ever
fires. The scrapers are admitted by the documented selectors metrics.allowedFrom (workers' metrics
ports, the server's metrics port) and redis.metrics.allowedFrom (else metrics.allowedFrom; the
exporter's port 9121): a monitor without them fails to render.
*/}}
{{- define "decodebench.validateScrape" -}}
{{- if .Values.networkPolicy.enabled }}
{{- $m := .Values.metrics }}
{{- $hint := "e.g. [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}], or networkPolicy.enabled=false" }}
{{- if and $m.podMonitor.enabled $m.enabled (not $m.allowedFrom) }}
{{- fail (printf "metrics.podMonitor: the workers' NetworkPolicy admits no scraper; set metrics.allowedFrom to Prometheus's peers (%s)" $hint) }}
{{- end }}
{{- if and $m.serverMonitor.enabled (not $m.allowedFrom) }}
{{- fail (printf "metrics.serverMonitor: the server's NetworkPolicy admits no scraper on its metrics port; set metrics.allowedFrom to Prometheus's peers (%s)" $hint) }}
{{- end }}
{{- if and $m.serviceMonitor.enabled .Values.redis.enabled .Values.redis.metrics.enabled (not (or .Values.redis.metrics.allowedFrom $m.allowedFrom)) }}
{{- fail (printf "metrics.serviceMonitor: Redis's NetworkPolicy admits no scraper on the exporter's port; set redis.metrics.allowedFrom or metrics.allowedFrom to Prometheus's peers (%s)" $hint) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The replicas of a Deployment KEDA scales, as the cluster holds them (lookup), or empty (install,
helm template, GitOps). Rendered in place of the manual count so that Helm's three-way merge never
drops spec.replicas when a pool switches from manual replicas to KEDA (Kubernetes would reset it to
1, killing busy pods) nor fights KEDA on a later upgrade. Args: {root, name}.
*/}}
{{- define "decodebench.liveReplicas" -}}
{{- if not .root.Values.gitops }}
{{- $live := lookup "apps/v1" "Deployment" .root.Release.Namespace .name }}
{{- if and $live $live.spec (hasKey $live.spec "replicas") }}{{ int $live.spec.replicas }}{{ end }}
{{- end }}
{{- end }}

{{/*
An extraEnv that names a variable the chart already sets in that container: two entries of one name, which
server-side apply (Helm 4, Argo CD, Flux) refuses and a client-side apply resolves by silently keeping the last.
Renders nothing; fails in one line naming the variable. `own`: the chart's env list (YAML), `extra`: the values'.
*/}}
{{- define "decodebench.extraEnvChecked" -}}
{{- $own := list }}
{{- range (fromYamlArray .own) }}{{ $own = append $own .name }}{{ end }}
{{- range .extra }}
{{- if has .name $own }}
{{- fail (printf "%s: %s is set by the chart in this container; set the chart's own value for it (docs/settings.md, docs/deploy.md) instead of a second entry" $.where .name) }}
{{- end }}
{{- end }}
{{- end }}
