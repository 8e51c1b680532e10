"""`flexmig controller`: the cluster-side allocator (mode `controller`), with leader election, metrics
and /healthz on the metrics port, and the pod webhook (every replica serves it; only the leader writes:
see controller/webhook/service.py). Every background loop runs under a LoopRunner: controller/runtime/process.py."""

from __future__ import annotations

import argparse
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import structlog

from api.constants import DEFAULT_CONTROLLER_METRICS_PORT
from driver.transportretry import with_safe_retries
from flexmig.cliargs import UsageError
from flexmig.commands.controller_moves import add_move_flags, move_settings, validate_move_flags
from flexmig.commands.controller_webhook import (
    add_webhook_flags,
    load_defaults,
    mapped_resources,
    validate_webhook_flags,
    webhook_settings,
)

log = structlog.get_logger(__name__)

MODES = ("controller", "scheduler")
POLICIES = ("flexmig", "first-fit")
BURST_PLAN_BUDGET_S = 0.5  # driver/policy/burstplan.py TIME_BUDGET_S (not imported: keeps `--help` light)
PREEMPTION_HOLD_S = 120.0  # controller/allocation/nominate.py HOLD_S (not imported: keeps `--help` light)
MAX_PREEMPTION_HOLD_S = 3600.0
# controller/allocation/writepool.py's (not imported: keeps `--help` light; a test checks they agree)
DEFAULT_WRITE_CONCURRENCY = 32
MAX_WRITE_CONCURRENCY = 64
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
        "--write-concurrency",
        type=int,
        default=DEFAULT_WRITE_CONCURRENCY,
        help=f"pods whose API writes (finalizer, allocation, gate) are in flight at once, 1 to "
        f"{MAX_WRITE_CONCURRENCY}; each pod's writes stay in order, decisions stay one at a time "
        f"(1: one pod after another; default {DEFAULT_WRITE_CONCURRENCY})",
    )
    p.add_argument(
        "--preemption",
        default="true",
        help="true or false: evict lower-priority pods (Eviction API, PodDisruptionBudgets honoured) "
        "for a pod that fits nowhere, as kube-scheduler does for ungated pods (default true)",
    )
    p.add_argument(
        "--preemption-hold",
        type=float,
        default=PREEMPTION_HOLD_S,
        help="seconds the devices freed by a preemption stay held for the preemptor after its victims "
        f"are gone, 1 to {MAX_PREEMPTION_HOLD_S:g} (default {PREEMPTION_HOLD_S:g})",
    )
    add_move_flags(p)
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
    if not 1 <= args.write_concurrency <= MAX_WRITE_CONCURRENCY:
        return (
            f"--write-concurrency: {args.write_concurrency} is not a number from 1 to {MAX_WRITE_CONCURRENCY}"
        )
    if args.preemption not in ("true", "false"):
        return f"--preemption: {args.preemption!r} is not one of true, false"
    if not 1 <= args.preemption_hold <= MAX_PREEMPTION_HOLD_S:  # NaN fails too
        return f"--preemption-hold: {args.preemption_hold} is not a number of seconds from 1 to {MAX_PREEMPTION_HOLD_S:g}"
    if (problem := validate_move_flags(args)) is not None:
        return problem
    if not 0 <= args.metrics_port <= 65535:
        return f"--metrics-port: {args.metrics_port} is not a port (0..65535, 0 disables)"
    if args.leader_elect not in ("true", "false"):
        return f"--leader-elect: {args.leader_elect!r} is not one of true, false"
    return validate_webhook_flags(args)


def _api_client(kubeconfig: str | None, write_concurrency: int = 1) -> Any:
    """The API client for `--kubeconfig`, else the in-cluster service account; UsageError naming the
    flag when neither can be loaded (before: a ConfigException traceback)."""
    from kubernetes import client as k8s
    from kubernetes import config as kconfig

    base = k8s.Configuration()
    # One connection per write worker besides the watches' and the loops': a full pool would open a
    # new TLS connection for each write and throw it away after.
    base.connection_pool_maxsize = (base.connection_pool_maxsize or 1) + write_concurrency
    conf = with_safe_retries(base)  # writes are never re-sent blindly
    if kubeconfig:
        if not os.path.isfile(kubeconfig):
            raise UsageError(f"--kubeconfig: {kubeconfig} does not exist; allowed: a kubeconfig file")
        try:
            return kconfig.new_client_from_config(config_file=kubeconfig, client_configuration=conf)  # type: ignore[no-untyped-call]
        except Exception as exc:  # ConfigException, YAML and key errors: all mean a bad file
            raise UsageError(f"--kubeconfig: cannot load {kubeconfig}: {_first_line(exc)}") from None
    try:
        kconfig.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
    except kconfig.ConfigException as exc:
        raise UsageError(
            "--kubeconfig: not given ($KUBECONFIG unset) and not running in a cluster "
            f"({_first_line(exc)}); allowed: a kubeconfig file, or run in a pod with a service account"
        ) from None
    return k8s.ApiClient(conf)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def run(args: argparse.Namespace) -> int:
    problem = _validate(args)
    if problem is not None:
        # One line on stderr (the pod's log too); flexmig.cli prints UsageError, exit 2.
        raise UsageError(problem)
    if args.mode == "scheduler":
        # kube-scheduler allocates from the published slices; pods are not gated, nothing to do here.
        print("flexmig controller: mode 'scheduler' needs no controller (kube-scheduler allocates); exiting")
        return 0
    from controller.runtime.process import ControllerProcess, ProcessOptions
    from controller.webhook.server import bind_check
    from driver.policy.allocator import FirstFitPolicy, PackingPolicy

    settings = webhook_settings(args)
    try:
        defaults = replace(
            load_defaults(args.device_config), mapped_resources=mapped_resources(args.mapped_resources)
        )
        if settings is not None and (problem := bind_check(settings.address, settings.port)):
            raise ValueError(f"--webhook-port: {problem}")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    api = _api_client(args.kubeconfig, args.write_concurrency)
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
        write_concurrency=args.write_concurrency,
        preemption=args.preemption == "true",
        preemption_hold_s=args.preemption_hold,
        moves=move_settings(args),
    )
    try:
        process = ControllerProcess(api, options, webhook=webhook)
    except OSError as exc:
        raise UsageError(f"--metrics-port: cannot listen on {args.metrics_port}: {exc}") from None
    signal.signal(signal.SIGTERM, lambda *_: process.stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: process.stop_event.set())
    log.info(
        "controller starting",
        identity=args.identity,
        policy=args.policy,
        preemption=args.preemption,
        moves=args.moves,
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
