{{/* The DRA driver name: ResourceSlice spec.driver, kubelet plugin name, CEL attribute domain. */}}
{{- define "flexmig.driverName" -}}gpu.flexmig.dev{{- end -}}

{{- define "flexmig.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix of every namespaced object's name (and of cluster-scoped ones, to keep releases apart). */}}
{{- define "flexmig.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "flexmig.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "flexmig.labels" -}}
helm.sh/chart: {{ include "flexmig.chart" . }}
app.kubernetes.io/name: {{ include "flexmig.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: flexmig
{{- end -}}

{{/* Selector labels of one component; call with (dict "root" $ "component" "controller"). */}}
{{- define "flexmig.selectorLabels" -}}
app.kubernetes.io/name: {{ include "flexmig.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* repository@digest when a digest is given, else repository:tag (tag defaults to appVersion). */}}
{{- define "flexmig.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "flexmig.controllerName" -}}{{ include "flexmig.fullname" . }}-controller{{- end -}}
{{- define "flexmig.pluginName" -}}{{ include "flexmig.fullname" . }}-kubelet-plugin{{- end -}}
{{- define "flexmig.webhookName" -}}{{ include "flexmig.fullname" . }}-webhook{{- end -}}
{{- define "flexmig.deviceConfigName" -}}{{ include "flexmig.fullname" . }}-device-config{{- end -}}
{{- define "flexmig.nodeConfigName" -}}{{ include "flexmig.fullname" . }}-node-config{{- end -}}
{{/* The self-generated webhook CA and certificate, shared by the controller replicas. */}}
{{- define "flexmig.webhookCertSecretName" -}}{{ include "flexmig.fullname" . }}-webhook-cert{{- end -}}

{{/* The device ConfigMap's file: HAMi's device config shape ({nvidia: {...}}). */}}
{{- define "flexmig.deviceConfigData" -}}
{{- if .Values.deviceConfig.hamiConfig -}}
{{- /* HAMi's device-config.yaml as written: used verbatim by the plugin and the controller. */ -}}
{{- .Values.deviceConfig.hamiConfig -}}
{{- else -}}
nvidia:
  defaultMemory: {{ int .Values.deviceConfig.defaultMemory }}
  defaultCores: {{ int .Values.deviceConfig.defaultCores }}
  defaultGPUNum: {{ int .Values.deviceConfig.defaultGPUNum }}
  memoryFactor: {{ int .Values.deviceConfig.memoryFactor }}
  deviceSplitCount: {{ int .Values.deviceConfig.deviceSplitCount }}
  deviceMemoryScaling: {{ .Values.deviceConfig.deviceMemoryScaling }}
  deviceCoreScaling: {{ .Values.deviceConfig.deviceCoreScaling }}
  {{- with .Values.deviceConfig.resourceNames }}
  {{- range $key, $name := . }}
  {{ $key }}: {{ $name | quote }}
  {{- end }}
  {{- end }}
  migProfileAllowlist:
    {{- toYaml .Values.deviceConfig.migProfileAllowlist | nindent 4 }}
{{- end -}}
{{- end -}}
{{/* The resource names the shim reads (HAMi's resource*Name keys of the device config), for the
webhook's matchConditions: a custom name under another prefix must still send the pod. */}}
{{- define "flexmig.shimResourceNames" -}}
{{- $nvidia := dict -}}
{{- if .Values.deviceConfig.hamiConfig -}}
{{- $nvidia = (fromYaml .Values.deviceConfig.hamiConfig).nvidia | default dict -}}
{{- else -}}
{{- $nvidia = .Values.deviceConfig.resourceNames | default dict -}}
{{- end -}}
{{- $out := list -}}
{{- range $key := list "resourceCountName" "resourceMemoryName" "resourceMemoryPercentageName" "resourceCoreName" "resourcePriorityName" -}}
{{- with (get $nvidia $key) -}}{{- $out = append $out . -}}{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}
{{/* The node ConfigMap's config.json: HAMi's as written, or built from nodeConfig.nodeconfig. */}}
{{- define "flexmig.nodeConfigData" -}}
{{- if .Values.nodeConfig.hamiConfig -}}
{{- .Values.nodeConfig.hamiConfig -}}
{{- else -}}
{{- dict "nodeconfig" .Values.nodeConfig.nodeconfig | toPrettyJson -}}
{{- end -}}
{{- end -}}
{{/* The cluster-scoped MutatingWebhookConfiguration; the controller patches its caBundle. */}}
{{- define "flexmig.webhookConfigName" -}}{{ include "flexmig.fullname" . }}.{{ include "flexmig.driverName" . }}{{- end -}}
{{- define "flexmig.nodeScopePolicyName" -}}{{ include "flexmig.fullname" . }}-slices-node-scope.{{ include "flexmig.driverName" . }}{{- end -}}
{{- define "flexmig.podScopePolicyName" -}}{{ include "flexmig.fullname" . }}-pods-node-scope.{{ include "flexmig.driverName" . }}{{- end -}}

{{- define "flexmig.controllerEnabled" -}}
{{- if eq .Values.allocationMode "controller" -}}true{{- end -}}
{{- end -}}

{{- define "flexmig.webhookEnabled" -}}
{{- if and (eq .Values.allocationMode "controller") .Values.webhook.enabled -}}true{{- end -}}
{{- end -}}

{{/* Where the plugin's DRA socket and checkpoint live on the host (and, identically, in the pod). */}}
{{- define "flexmig.pluginDataDir" -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.kubeletPlugin.kubeletPluginsDir) (include "flexmig.driverName" .) -}}
{{- end -}}

{{/* Lease name is fixed in the controller (controller/kube/leader.py LEASE_NAME). */}}
{{- define "flexmig.leaseName" -}}flexmig-controller{{- end -}}

{{/* The controller's room state (controller/kube/roomstore.py ROOM_STATE_NAME). */}}
{{- define "flexmig.roomStateName" -}}flexmig-room-state{{- end -}}

{{/* ServiceAccount names: the created one, or the existing one named in the values. */}}
{{- define "flexmig.controllerServiceAccount" -}}
{{- default (include "flexmig.controllerName" .) .Values.controller.serviceAccount.name -}}
{{- end -}}
{{- define "flexmig.pluginServiceAccount" -}}
{{- default (include "flexmig.pluginName" .) .Values.kubeletPlugin.serviceAccount.name -}}
{{- end -}}
{{- define "flexmig.testName" -}}{{ include "flexmig.fullname" . }}-test{{- end -}}

{{/* A metrics Service's nodePort is only for type NodePort: given with ClusterIP it would be silently
unused. Arguments: dict "where" (the values path), "service". */}}
{{- define "flexmig.metricsServiceCheck" -}}
{{- if and .service.nodePort (ne .service.type "NodePort") -}}
{{- fail (printf "%s.metrics.service.nodePort is %v but %s.metrics.service.type is %s; set type NodePort to use it, or leave nodePort null" .where .service.nodePort .where .service.type) -}}
{{- end -}}
{{- end -}}
