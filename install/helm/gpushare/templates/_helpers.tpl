{{/* Names. */}}
{{- define "gpushare.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpushare.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gpushare.labels" -}}
app.kubernetes.io/name: {{ include "gpushare.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* selectorLabels COMPONENT: pass (list . "node") */}}
{{- define "gpushare.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ include "gpushare.name" $ }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "gpushare.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* v<major>.<minor>.<patch> of the cluster (build suffixes such as +k3s1 dropped). */}}
{{- define "gpushare.kubeTag" -}}
{{- $v := semver .Capabilities.KubeVersion.Version -}}
{{- printf "v%d.%d.%d" $v.Major $v.Minor $v.Patch -}}
{{- end -}}

{{- define "gpushare.kubeSchedulerImage" -}}
{{- $i := .Values.scheduler.secondScheduler.image -}}
{{- printf "%s:%s" $i.repository (default (include "gpushare.kubeTag" .) $i.tag) -}}
{{- end -}}

{{- define "gpushare.kubectlImage" -}}
{{- $i := .Values.cleanup.image -}}
{{- printf "%s:%s" $i.repository (default (include "gpushare.kubeTag" .) $i.tag) -}}
{{- end -}}

{{- define "gpushare.agentServiceAccount" -}}
{{- default (printf "%s-node" (include "gpushare.fullname" .)) .Values.agent.serviceAccount.name -}}
{{- end -}}

{{- define "gpushare.schedulerServiceAccount" -}}
{{- default (printf "%s-scheduler" (include "gpushare.fullname" .)) .Values.scheduler.serviceAccount.name -}}
{{- end -}}

{{- define "gpushare.tlsSecret" -}}
{{- default (printf "%s-extender-tls" (include "gpushare.fullname" .)) .Values.scheduler.tls.existingSecret -}}
{{- end -}}

{{- define "gpushare.schedulerServiceName" -}}
{{- printf "%s-scheduler" (include "gpushare.fullname" .) -}}
{{- end -}}

{{/* The limiter library on the host (and, same path, in the agent's pod). */}}
{{- define "gpushare.limiterHostPath" -}}
{{- printf "%s/lib/libgpushare_limiter.so" (trimSuffix "/" .Values.agent.hostDir) -}}
{{- end -}}

{{- define "gpushare.nriSocketDir" -}}
{{- dir .Values.agent.nriSocket -}}
{{- end -}}

{{/* Env pointing in-cluster clients at the API server (values `kubernetes`). */}}
{{- define "gpushare.apiServerEnv" -}}
{{- with .Values.kubernetes.apiServerHost }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ . | quote }}
{{- end }}
{{- with .Values.kubernetes.apiServerPort }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ . | quote }}
- name: KUBERNETES_SERVICE_PORT_HTTPS
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* The agent's scheduling constraints, shared with the clean-up DaemonSet. */}}
{{- define "gpushare.agentPlacement" -}}
{{- with .Values.agent.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.agent.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.agent.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The port of a host:port value. */}}
{{- define "gpushare.statusPort" -}}
{{- last (splitList ":" .Values.agent.config.statusListen) -}}
{{- end -}}
