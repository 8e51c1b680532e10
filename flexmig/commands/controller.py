"""`flexmig controller`: the cluster-side allocator (mode `controller`), with leader election, metrics
and /healthz on the metrics port, and the pod webhook (every replica serves it; only the leader writes:
see controller/webhook/service.py). Every background loop runs under a LoopRunner: controller/runtime/process.py."""

from __future__ import annotations

import argparse
import os
import signal
import socket
from collections.abc import Callable
from typing import Any

import structlog

from api.constants import DEFAULT_CONTROLLER_METRICS_PORT
from flexmig.commands.controller_webhook import (
    add_webhook_flags,
    load_defaults,
    validate_webhook_flags,
    webhook_settings,
)

log = structlog.get_logger(__name__)

MODES = ("controller", "scheduler")
POLICIES = ("flexmig", "first-fit")
BURST_PLAN_BUDGET_S = 0.5  # driver/policy/burstplan.py TIME_BUDGET_S (not imported: keeps `--help` light)
MAX_BURST_BUDGET_S = 10.0  # the step's pods wait for the plan: more than this is a stalled controller


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("controller", help="run the allocation controller")
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="default: in-cluster config")
    p.add_argument("--mode", default="controller", help=f"allocation mode: {', '.join(MODES)}")
    p.add_argument("--policy", default="flexmig", help=f"placement policy: {', '.join(POLICIES)}")
    p.add_argument(
        "--burst-plan-budget",
        type=float,
        default=BURST_PLAN_BUDGET_S,
        help=f"seconds a step may spend planning its one-device MIG pods together, 0 to {MAX_BURST_BUDGET_S:g} "
        f"(0 turns burst plans off; default {BURST_PLAN_BUDGET_S:g})",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=DEFAULT_CONTROLLER_METRICS_PORT,
        help="/metrics and /healthz; 0 disables",
    )
    p.add_argument("--leader-elect", default="true", help="true or false")
    p.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE", "kube-system"))
    p.add_argument("--identity", default=os.environ.get("POD_NAME") or socket.gethostname())
    add_webhook_flags(p)
    p.set_defaults(func=run)


def _validate(args: argparse.Namespace) -> str | None:
    if args.mode not in MODES:
        return f"--mode: {args.mode!r} is not one of {', '.join(MODES)}"
    if args.policy not in POLICIES:
        return f"--policy: {args.policy!r} is not one of {', '.join(POLICIES)}"
    if not 0 <= args.burst_plan_budget <= MAX_BURST_BUDGET_S:  # NaN fails too
        return (
            f"--burst-plan-budget: {args.burst_plan_budget} is not a number of seconds from 0 to "
            f"{MAX_BURST_BUDGET_S:g} (0 turns burst plans off)"
        )
    if not 0 <= args.metrics_port <= 65535:
        return f"--metrics-port: {args.metrics_port} is not a port (0..65535, 0 disables)"
    if args.leader_elect not in ("true", "false"):
        return f"--leader-elect: {args.leader_elect!r} is not one of true, false"
    return validate_webhook_flags(args)


def run(args: argparse.Namespace) -> int:
    problem = _validate(args)
    if problem is not None:
        log.error("invalid flag", problem=problem)
        print(f"flexmig controller: {problem}")
        return 2
    if args.mode == "scheduler":
        # kube-scheduler allocates from the published slices; pods are not gated, nothing to do here.
        print("flexmig controller: mode 'scheduler' needs no controller (kube-scheduler allocates); exiting")
        return 0
    from kubernetes import config as kconfig

    from controller.runtime.process import ControllerProcess, ProcessOptions
    from controller.webhook.server import bind_check
    from driver.policy.allocator import FirstFitPolicy, PackingPolicy

    settings = webhook_settings(args)
    try:
        defaults = load_defaults(args.device_config)
        if settings is not None and (problem := bind_check(settings.address, settings.port)):
            raise ValueError(f"--webhook-port: {problem}")
    except ValueError as exc:
        log.error("invalid flag", problem=str(exc))
        print(f"flexmig controller: {exc}")
        return 2
    if args.kubeconfig:
        api = kconfig.new_client_from_config(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
    else:
        kconfig.load_incluster_config()  # type: ignore[no-untyped-call]
        from kubernetes import client as k8s

        api = k8s.ApiClient()
    webhook: Any = None
    if settings is not None:
        from controller.webhook import WebhookService

        def webhook(is_leader: Callable[[], bool], metrics: Any) -> Any:
            return WebhookService(api, settings, defaults, is_leader=is_leader, registry=metrics.registry)

    options = ProcessOptions(
        identity=args.identity,
        lease_namespace=args.lease_namespace,
        leader_elect=args.leader_elect == "true",
        metrics_port=args.metrics_port or None,
        policy=PackingPolicy() if args.policy == "flexmig" else FirstFitPolicy(),
        burst_budget_s=args.burst_plan_budget,
    )
    try:
        process = ControllerProcess(api, options, webhook=webhook)
    except OSError as exc:
        log.error("cannot bind the metrics port", port=args.metrics_port, error=str(exc))
        print(f"flexmig controller: --metrics-port: cannot listen on {args.metrics_port}: {exc}")
        return 2
    signal.signal(signal.SIGTERM, lambda *_: process.stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: process.stop_event.set())
    log.info(
        "controller starting",
        identity=args.identity,
        policy=args.policy,
        metrics_port=process.metrics_port,
        webhook_port=args.webhook_port or None,
    )
    # Kubernetes version and DRA API first: a log line, flexmig_preflight_ok and an event instead of
    # a controller that misbehaves; it rechecks until they pass (controller/kube/preflight.py).
    from controller.kube.preflight import Preflight

    preflight = Preflight(
        api, process.metrics.registry, os.environ.get("POD_NAMESPACE"), os.environ.get("POD_NAME")
    )
    process.start_health()
    if not preflight.wait(process.stop_event.is_set, process.stop_event.wait):
        if process.health is not None:  # nothing else was started yet
            process.health.stop()
        return 0
    process.run()
    return 0
