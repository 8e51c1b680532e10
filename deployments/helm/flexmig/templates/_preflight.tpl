{{- /*
The preflight check of templates/preflight.yaml: on which nodes another manager of NVIDIA GPUs
(NVIDIA's device plugin, the GPU Operator's MIG manager, HAMi's device plugin) runs next to
flexmig's kubelet plugin. Node selection is judged the way the scheduler judges it: a nodeSelector
must be a subset of the node's labels, of the required node affinity's terms (ORed) one must
match with all its requirements (ANDed), and every NoSchedule/NoExecute taint of the node must be
tolerated (the pod's tolerations plus those the DaemonSet controller adds). The node.kubernetes.io/*
taints the node lifecycle controller sets for a passing condition (not-ready, unreachable, ...) do
not count: they say what the node is now, not where the DaemonSet runs once it is healthy. What
cannot be judged here (the operators Gt and Lt, field requirements other than metadata.name) counts
as a match: the check would rather refuse than miss a shared node. Every template that answers a
question writes "true" or nothing.
*/}}

{{- /* The kubelet plugin's node affinity when kubeletPlugin.affinity is empty: a node with any one
of kubeletPlugin.gpuNodeLabels (by default Node Feature Discovery's PCI vendor 10de label or the GPU
Operator's), one ORed term per label; nothing when the list is empty (every node). kubeletplugin.yaml
renders it and the preflight check evaluates it, so the two cannot drift apart. */}}
{{- define "flexmig.pluginDefaultAffinity" -}}
{{- with .Values.kubeletPlugin.gpuNodeLabels }}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
      {{- range . }}
      - matchExpressions:
          - key: {{ .key | quote }}
            operator: In
            values: [{{ .value | toString | quote }}]
      {{- end }}
{{- end }}
{{- end -}}

{{- /* The tolerations the DaemonSet controller adds to every daemon pod (and considers when it
decides which nodes should run one); network-unavailable only for host-network pods. Argument: the
pod spec's hostNetwork. Output: a JSON list. */}}
{{- define "flexmig.daemonSetAddedTolerations" -}}
{{- $out := list (dict "key" "node.kubernetes.io/not-ready" "operator" "Exists" "effect" "NoExecute") (dict "key" "node.kubernetes.io/unreachable" "operator" "Exists" "effect" "NoExecute") -}}
{{- range list "disk-pressure" "memory-pressure" "pid-pressure" "unschedulable" -}}
{{- $out = append $out (dict "key" (printf "node.kubernetes.io/%s" .) "operator" "Exists" "effect" "NoSchedule") -}}
{{- end -}}
{{- if . -}}
{{- $out = append $out (dict "key" "node.kubernetes.io/network-unavailable" "operator" "Exists" "effect" "NoSchedule") -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{- /* The node's taints that keep a pod off it are all tolerated, as the scheduler's TaintToleration
filter judges it: a toleration matches a taint when its effect is empty or the taint's, its key is
empty (with Exists) or the taint's, and its operator is Exists or its value equals the taint's.
Condition taints (node.kubernetes.io/*) are skipped, see the top. Arguments: dict "node",
"tolerations" (a list). */}}
{{- define "flexmig.preflight.tolerated" -}}
{{- $ok := true -}}
{{- range $taint := (.node.spec | default dict).taints | default list -}}
{{- $effect := toString $taint.effect -}}
{{- if and (has $effect (list "NoSchedule" "NoExecute")) (not (hasPrefix "node.kubernetes.io/" (toString $taint.key))) -}}
{{- $matched := false -}}
{{- range $t := $.tolerations -}}
{{- $tEffect := toString ($t.effect | default "") -}}
{{- $tKey := toString ($t.key | default "") -}}
{{- $op := toString ($t.operator | default "Equal") -}}
{{- $effectOk := or (eq $tEffect "") (eq $tEffect $effect) -}}
{{- $keyOk := or (and (eq $tKey "") (eq $op "Exists")) (eq $tKey (toString $taint.key)) -}}
{{- $valueOk := or (eq $op "Exists") (eq (toString ($t.value | default "")) (toString ($taint.value | default ""))) -}}
{{- if and $effectOk $keyOk $valueOk }}{{ $matched = true }}{{ end -}}
{{- end -}}
{{- if not $matched }}{{ $ok = false }}{{ end -}}
{{- end -}}
{{- end -}}
{{- if $ok }}true{{ end -}}
{{- end -}}

{{- /* Which other GPU manager a DaemonSet is (its display name), or nothing. Argument: the DaemonSet. */}}
{{- define "flexmig.preflight.foreignManager" -}}
{{- $labels := .metadata.labels | default dict -}}
{{- $name := .metadata.name -}}
{{- if or (eq (get $labels "app.kubernetes.io/name") "nvidia-device-plugin") (eq (get $labels "app") "nvidia-device-plugin-daemonset") (hasPrefix "nvidia-device-plugin" $name) -}}
NVIDIA's device plugin
{{- else if or (eq (get $labels "app") "nvidia-mig-manager") (hasPrefix "nvidia-mig-manager" $name) -}}
the GPU Operator's MIG manager
{{- else if or (eq (get $labels "app.kubernetes.io/component") "hami-device-plugin") (hasSuffix "hami-device-plugin" $name) -}}
HAMi's device plugin
{{- end -}}
{{- end -}}

{{- /* One node selector requirement. Arguments: dict "labels" (the node's), "name" (the node's),
"expr" (the requirement), "field" (true for a matchFields requirement). */}}
{{- define "flexmig.preflight.requirementMatches" -}}
{{- $values := list -}}
{{- range (.expr.values | default list) }}{{ $values = append $values (toString .) }}{{ end -}}
{{- $op := .expr.operator | default "" -}}
{{- $has := false -}}
{{- $value := "" -}}
{{- $judged := true -}}
{{- if .field -}}
{{- /* Field requirements: only metadata.name is a node field selector can name (In/NotIn). */ -}}
{{- if eq (toString .expr.key) "metadata.name" -}}
{{- $has = true -}}
{{- $value = .name -}}
{{- else -}}
{{- $judged = false -}}
{{- end -}}
{{- else -}}
{{- $has = hasKey .labels (toString .expr.key) -}}
{{- $value = toString (get .labels (toString .expr.key)) -}}
{{- end -}}
{{- if not $judged -}}
true
{{- else if eq $op "In" -}}
{{- if and $has (has $value $values) }}true{{ end -}}
{{- else if eq $op "NotIn" -}}
{{- if not (and $has (has $value $values)) }}true{{ end -}}
{{- else if eq $op "Exists" -}}
{{- if $has }}true{{ end -}}
{{- else if eq $op "DoesNotExist" -}}
{{- if not $has }}true{{ end -}}
{{- else -}}
{{- /* Gt, Lt or unknown: not judged, counts as a match. */ -}}
true
{{- end -}}
{{- end -}}

{{- /* One node selector term: all its requirements match; a term without any matches no node (as in
Kubernetes). Arguments: dict "labels", "name", "term". */}}
{{- define "flexmig.preflight.termMatches" -}}
{{- $exprs := .term.matchExpressions | default list -}}
{{- $fields := .term.matchFields | default list -}}
{{- $ok := true -}}
{{- if and (not $exprs) (not $fields) }}{{ $ok = false }}{{ end -}}
{{- range $exprs -}}
{{- if ne (include "flexmig.preflight.requirementMatches" (dict "labels" $.labels "name" $.name "expr" . "field" false)) "true" }}{{ $ok = false }}{{ end -}}
{{- end -}}
{{- range $fields -}}
{{- if ne (include "flexmig.preflight.requirementMatches" (dict "labels" $.labels "name" $.name "expr" . "field" true)) "true" }}{{ $ok = false }}{{ end -}}
{{- end -}}
{{- if $ok }}true{{ end -}}
{{- end -}}

{{- /* A pod spec's node selection selects a node. Arguments: dict "node" (a Node object),
"nodeSelector" (a map or nothing), "affinity" (a pod affinity or nothing; only the required node
affinity restricts nodes), "tolerations" (a list: the pod's and those the DaemonSet controller
adds). */}}
{{- define "flexmig.preflight.selects" -}}
{{- $labels := .node.metadata.labels | default dict -}}
{{- $name := .node.metadata.name -}}
{{- $ok := true -}}
{{- range $key, $want := (.nodeSelector | default dict) -}}
{{- if or (not (hasKey $labels $key)) (ne (toString (get $labels $key)) (toString $want)) }}{{ $ok = false }}{{ end -}}
{{- end -}}
{{- $required := dig "nodeAffinity" "requiredDuringSchedulingIgnoredDuringExecution" dict (.affinity | default dict) -}}
{{- if and $ok $required -}}
{{- $any := false -}}
{{- range ($required.nodeSelectorTerms | default list) -}}
{{- if eq (include "flexmig.preflight.termMatches" (dict "labels" $labels "name" $name "term" .)) "true" }}{{ $any = true }}{{ end -}}
{{- end -}}
{{- $ok = $any -}}
{{- end -}}
{{- if and $ok (ne (include "flexmig.preflight.tolerated" (dict "node" .node "tolerations" (.tolerations | default list))) "true") }}{{ $ok = false }}{{ end -}}
{{- if $ok }}true{{ end -}}
{{- end -}}

{{- /* A DaemonSet's status, current for its generation, says it wants no node. Argument: the
DaemonSet. */}}
{{- define "flexmig.preflight.wantsNoNode" -}}
{{- $status := .status | default dict -}}
{{- $current := and (hasKey $status "observedGeneration") (ge (int64 $status.observedGeneration) (int64 (.metadata.generation | default 0))) -}}
{{- if and $current (eq (int64 ($status.desiredNumberScheduled | default 0)) 0) }}true{{ end -}}
{{- end -}}

{{- /* The nodes a DaemonSet runs on or is about to, as a JSON list of names. Its pods say where: the
node each is bound to, or, before the scheduler binds it, the node the DaemonSet controller pins it
to (a metadata.name field term). Without pods (just created, or the controller cannot create them)
its pod template's node selection is evaluated against every node, unless its status, current for
its generation, says it wants no node. Arguments: dict "ds", "pods" (its namespace's), "nodes". */}}
{{- define "flexmig.preflight.daemonSetNodes" -}}
{{- /* A set, not a list: sprig's append copies the list and uniq compares every pair, quadratic in
the nodes of a large cluster. */ -}}
{{- $names := dict -}}
{{- $uid := .ds.metadata.uid -}}
{{- $owned := false -}}
{{- range $pod := .pods -}}
{{- range $ref := ($pod.metadata.ownerReferences | default list) -}}
{{- if eq $ref.uid $uid -}}
{{- $owned = true -}}
{{- if $pod.spec.nodeName -}}
{{- $_ := set $names $pod.spec.nodeName true -}}
{{- else -}}
{{- range $term := (dig "affinity" "nodeAffinity" "requiredDuringSchedulingIgnoredDuringExecution" "nodeSelectorTerms" list $pod.spec) -}}
{{- range $field := ($term.matchFields | default list) -}}
{{- if and (eq $field.key "metadata.name") (eq $field.operator "In") -}}
{{- range ($field.values | default list) }}{{ $_ := set $names (toString .) true }}{{ end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (not $owned) (ne (include "flexmig.preflight.wantsNoNode" .ds) "true") -}}
{{- $podSpec := .ds.spec.template.spec -}}
{{- $tolerations := concat ($podSpec.tolerations | default list) (include "flexmig.daemonSetAddedTolerations" ($podSpec.hostNetwork | default false) | fromJsonArray) -}}
{{- range $node := .nodes -}}
{{- if eq (include "flexmig.preflight.selects" (dict "node" $node "nodeSelector" $podSpec.nodeSelector "affinity" $podSpec.affinity "tolerations" $tolerations)) "true" -}}
{{- $_ := set $names $node.metadata.name true -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- keys $names | sortAlpha | toJson -}}
{{- end -}}

{{- /* Up to 3 node names, sorted, then how many more. Argument: a list of names. */}}
{{- define "flexmig.preflight.someNodes" -}}
{{- $sorted := sortAlpha . -}}
{{- join ", " (slice $sorted 0 (min 3 (len $sorted))) -}}
{{- if gt (len $sorted) 3 }} and {{ sub (len $sorted) 3 }} more{{ end -}}
{{- end -}}

{{- /* The judgement on data already read, as JSON: "conflicts", one sentence per other GPU manager
that shares a node with flexmig's kubelet plugin, and "noPluginNode", true when no current node is
one flexmig's plugin would run on. Then the chart cannot tell whether the two will share nodes once
GPU nodes join (a node pool autoscaling from zero) or get their labels (Node Feature Discovery, the
GPU Operator), so every other manager counts unless its status says it runs on no node. flexmig's
node selection is taken once (the default affinity parsed once, each node judged once), not per
DaemonSet and node. Arguments: dict "plugin" (Values.kubeletPlugin), "defaultAffinity" (parsed),
"daemonSets" (the other managers' only), "pods" (namespace -> its pods), "nodes". */}}
{{- define "flexmig.preflight.judge" -}}
{{- $affinity := .plugin.affinity | default .defaultAffinity -}}
{{- $tolerations := concat (.plugin.tolerations | default list) (.plugin.extraTolerations | default list) (include "flexmig.daemonSetAddedTolerations" .plugin.hostNetwork | fromJsonArray) -}}
{{- $pluginNodes := dict -}}
{{- range $node := .nodes -}}
{{- if eq (include "flexmig.preflight.selects" (dict "node" $node "nodeSelector" $.plugin.nodeSelector "affinity" $affinity "tolerations" $tolerations)) "true" -}}
{{- $_ := set $pluginNodes $node.metadata.name true -}}
{{- end -}}
{{- end -}}
{{- $found := list -}}
{{- range $ds := .daemonSets -}}
{{- $what := include "flexmig.preflight.foreignManager" $ds -}}
{{- $ns := $ds.metadata.namespace -}}
{{- $where := include "flexmig.preflight.daemonSetNodes" (dict "ds" $ds "pods" (get $.pods $ns | default list) "nodes" $.nodes) | fromJsonArray -}}
{{- if $pluginNodes -}}
{{- $shared := dict -}}
{{- range $name := $where }}{{ if hasKey $pluginNodes $name }}{{ $_ := set $shared $name true }}{{ end }}{{ end -}}
{{- if $shared -}}
{{- $found = append $found (printf "%s (daemonset %s/%s) runs on %d of flexmig's GPU nodes: %s" $what $ns $ds.metadata.name (len $shared) (include "flexmig.preflight.someNodes" (keys $shared))) -}}
{{- end -}}
{{- else if $where -}}
{{- $found = append $found (printf "%s (daemonset %s/%s) runs on %d %s: %s" $what $ns $ds.metadata.name (len $where) (ternary "node" "nodes" (eq (len $where) 1)) (include "flexmig.preflight.someNodes" $where)) -}}
{{- else -}}
{{- /* Scheduled nowhere now, like flexmig: a GPU pool that scales from zero brings both at once. */ -}}
{{- $found = append $found (printf "%s (daemonset %s/%s) exists, scheduled to no node yet" $what $ns $ds.metadata.name) -}}
{{- end -}}
{{- end -}}
{{- dict "conflicts" $found "noPluginNode" (not $pluginNodes) | toJson -}}
{{- end -}}

{{- /* The preflight judgement of the live cluster (see flexmig.preflight.judge), or nothing with
preflight.allowCoexistence or without the plugin. Nodes and the namespaces' pods are read
(`lookup`) only once a DaemonSet of another manager is found. Argument: the chart's context. */}}
{{- define "flexmig.preflight.conflicts" -}}
{{- if and (not .Values.preflight.allowCoexistence) .Values.kubeletPlugin.enabled -}}
{{- $foreign := list -}}
{{- range $ds := ((lookup "apps/v1" "DaemonSet" "" "").items | default list) -}}
{{- if include "flexmig.preflight.foreignManager" $ds }}{{ $foreign = append $foreign $ds }}{{ end -}}
{{- end -}}
{{- if $foreign -}}
{{- $pods := dict -}}
{{- range $ds := $foreign -}}
{{- $ns := $ds.metadata.namespace -}}
{{- if not (hasKey $pods $ns) }}{{ $_ := set $pods $ns ((lookup "v1" "Pod" $ns "").items | default list) }}{{ end -}}
{{- end -}}
{{- $nodes := (lookup "v1" "Node" "" "").items | default list -}}
{{- $defaultAffinity := include "flexmig.pluginDefaultAffinity" . | fromYaml | default dict -}}
{{- include "flexmig.preflight.judge" (dict "plugin" .Values.kubeletPlugin "defaultAffinity" $defaultAffinity "daemonSets" $foreign "pods" $pods "nodes" $nodes) -}}
{{- end -}}
{{- end -}}
{{- end -}}
