"""`flexmig controller`: the cluster-side allocator (mode `controller`), with leader election, metrics
and the pod webhook (every replica serves it; only the leader writes: see controller/webhook/service.py)."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import threading
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


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("controller", help="run the allocation controller")
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="default: in-cluster config")
    p.add_argument("--mode", default="controller", help=f"allocation mode: {', '.join(MODES)}")
    p.add_argument("--policy", default="flexmig", help=f"placement policy: {', '.join(POLICIES)}")
    p.add_argument("--metrics-port", type=int, default=DEFAULT_CONTROLLER_METRICS_PORT, help="0 disables")
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
    from prometheus_client import start_http_server

    from controller.leader import LeaderElector
    from controller.loop import Controller
    from controller.metrics import ControllerMetrics
    from controller.watchcache import WatchCache
    from controller.webhook.server import bind_check
    from controller.writer import Writer
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
    metrics = ControllerMetrics()
    if args.metrics_port:
        start_http_server(args.metrics_port, registry=metrics.registry)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    elector = None
    if args.leader_elect == "true":
        elector = LeaderElector(api, args.lease_namespace, args.identity)
        elector.start()

    def leading() -> bool:
        value = elector is None or elector.is_leader()
        metrics.set_leader(value)
        return value

    webhook = None
    if settings is not None:
        from controller.webhook import WebhookService

        webhook = WebhookService(api, settings, defaults, is_leader=leading, registry=metrics.registry)
        webhook.start()
    policy = PackingPolicy() if args.policy == "flexmig" else FirstFitPolicy()
    controller = Controller(
        WatchCache.for_api(api), Writer(api), policy=policy, metrics=metrics, is_leader=leading
    )
    log.info(
        "controller starting",
        identity=args.identity,
        policy=args.policy,
        metrics_port=args.metrics_port,
        webhook_port=args.webhook_port or None,
    )
    controller.run(stop.is_set)
    if webhook is not None:
        webhook.stop()
    if elector is not None:
        elector.stop_event.set()
        elector.join(timeout=5)
    return 0
