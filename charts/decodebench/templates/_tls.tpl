{{/*
TLS of the two doors (docs/deploy.md, "TLS at the door"): the server's own HTTPS (server.tls) and an
external Redis over rediss:// (redis.external.caSecret). Certificates are always verified; these
helpers mount the CA bundles the clients verify with.
*/}}

{{/* The server's URL inside the cluster: https://<svc>.<ns>.svc:8080 with server.tls (the name its certificate must carry), else http://<svc>:8080. */}}
{{- define "decodebench.apiUrl" -}}
{{- $svc := (include "decodebench.serverSecrets" . | fromJson).service }}
{{- if .Values.server.tls.existingSecret }}
{{- printf "https://%s.%s.svc:8080" $svc .Release.Namespace }}
{{- else }}
{{- printf "http://%s:8080" $svc }}
{{- end }}
{{- end }}

{{/* Whether in-cluster clients of the server mount a CA bundle (server.tls with a caKey). */}}
{{- define "decodebench.serverCaOn" -}}
{{- if and .Values.server.tls.existingSecret .Values.server.tls.caKey }}true{{ end }}
{{- end }}

{{/* The server's CA bundle as a volume of a client pod (the controller, helm test). */}}
{{- define "decodebench.serverCaVolume" -}}
{{- if include "decodebench.serverCaOn" . }}
- name: server-ca
  secret:
    secretName: {{ .Values.server.tls.existingSecret }}
    items:
      - {key: {{ .Values.server.tls.caKey }}, path: ca.crt}
{{- end }}
{{- end }}

{{- define "decodebench.serverCaMount" -}}
{{- if include "decodebench.serverCaOn" . }}
- name: server-ca
  mountPath: /etc/decodebench-server-ca
  readOnly: true
{{- end }}
{{- end }}

{{/* Whether the Redis clients mount a CA bundle: an external rediss:// Redis with redis.external.caSecret. */}}
{{- define "decodebench.redisCaOn" -}}
{{- if and (not .Values.redis.enabled) (hasPrefix "rediss://" .Values.redis.external.url) .Values.redis.external.caSecret }}true{{ end }}
{{- end }}

{{- define "decodebench.redisCaVolume" -}}
{{- if include "decodebench.redisCaOn" . }}
- name: redis-ca
  secret:
    secretName: {{ .Values.redis.external.caSecret }}
    items:
      - {key: {{ .Values.redis.external.caKey }}, path: ca.crt}
{{- end }}
{{- end }}

{{- define "decodebench.redisCaMount" -}}
{{- if include "decodebench.redisCaOn" . }}
- name: redis-ca
  mountPath: /etc/decodebench-redis-ca
  readOnly: true
{{- end }}
{{- end }}

{{/* Whether KEDA's Redis triggers take a TriggerAuthentication: a password, or a rediss:// CA bundle. */}}
{{- define "decodebench.kedaAuthOn" -}}
{{- if or (include "decodebench.redisLogin" (dict "root" . "role" "keda") | fromJson).secretName (include "decodebench.redisCaOn" .) }}true{{ end }}
{{- end }}
