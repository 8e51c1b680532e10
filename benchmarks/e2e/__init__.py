"""Time to a running pod, end to end: `python3 -m benchmarks.e2e`.

What a user feels is the time from `kubectl apply` to a running container, through the API server,
the webhook, the controller's gate, kube-scheduler and the kubelet plugin. This benchmark measures
that on the real control plane the e2e tests build (tests/e2e/cluster.py), with flexmig installed by
its Helm chart on simulated nodes (tests/e2e/scenario.py: each node a kubelet stand-in and a real
`flexmig kubeletplugin` process on the NVML simulator, the controller a real process). With
`--real-node` the pods go to ONE real node instead: a real kubelet, containerd and runc
(tests/e2e/realnode/scenario.py) that run every pod's container; only the GPUs, their device nodes and
the driver's files are stood in.

Modules: `timeline` (one pod watch records when each pod passed each stage), `workloads` (the pods of
each kind and the burst that creates them), `procstats` (CPU seconds and peak RSS of a process from
/proc), `realnode` (the real-node mode's scenario and what it measures on the node), `run` (one
measured configuration), `__main__` (the matrix and the table).
"""
