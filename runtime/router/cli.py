"""`radixgen router --worker-urls URL...`: one front end for replicas on any machines."""

from __future__ import annotations

import argparse
import sys

from radixgen.runtime.router.policy import CacheAwareSettings


def add_router_command(subparsers) -> None:
    parser = subparsers.add_parser(
        "router",
        help="route requests over `radixgen serve` replicas by cached prefix",
        description="A cache-aware router in front of running `radixgen serve` replicas.",
    )
    parser.add_argument(
        "--worker-urls", nargs="+", required=True, metavar="URL", help="the replicas' base URLs"
    )
    parser.add_argument(
        "--routing-policy",
        "--policy",
        dest="routing_policy",
        choices=["cache_aware", "round_robin"],
        default="cache_aware",
        help="longest remembered prefix unless load is imbalanced, or round robin "
        "(default: cache_aware)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="(default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=30000, help="(default: 30000)")
    defaults = CacheAwareSettings()
    parser.add_argument(
        "--cache-threshold",
        type=float,
        default=defaults.cache_threshold,
        help="a replica is chosen for its cache when it remembers at least this fraction of "
        f"the prompt (default: {defaults.cache_threshold})",
    )
    parser.add_argument(
        "--balance-abs-threshold",
        type=int,
        default=defaults.balance_abs_threshold,
        help="load is imbalanced when the busiest replica has this many more requests in flight "
        f"than the idlest... (default: {defaults.balance_abs_threshold})",
    )
    parser.add_argument(
        "--balance-rel-threshold",
        type=float,
        default=defaults.balance_rel_threshold,
        help=f"...and this many times as many (default: {defaults.balance_rel_threshold})",
    )
    parser.add_argument(
        "--health-check-interval-s",
        type=float,
        default=2.0,
        help="seconds between health checks of each replica (default: 2.0)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="(default: info)",
    )
    parser.set_defaults(handler=run_router_command)


def run_router_command(namespace: argparse.Namespace) -> int:
    from radixgen.runtime.router.app import RouterArgs
    from radixgen.runtime.router.launch import serve_router

    try:
        settings = CacheAwareSettings(
            cache_threshold=namespace.cache_threshold,
            balance_abs_threshold=namespace.balance_abs_threshold,
            balance_rel_threshold=namespace.balance_rel_threshold,
        )
        args = RouterArgs(
            worker_urls=tuple(namespace.worker_urls),
            routing_policy=namespace.routing_policy,
            cache_aware=settings,
            health_check_interval_s=namespace.health_check_interval_s,
        )
    except ValueError as error:
        print(f"radixgen router: error: {error}", file=sys.stderr)
        return 2
    return serve_router(
        args, host=namespace.host, port=namespace.port, log_level=namespace.log_level
    )
