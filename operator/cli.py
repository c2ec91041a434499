"""`fleetmq-operator`: `kopf run` of the fleetmq handlers, with the flags a deployment needs.

    fleetmq-operator --kubeconfig ~/.kube/config --namespace mq --metrics 0.0.0.0:8080
    fleetmq-operator --all-namespaces --peering fleetmq --liveness http://0.0.0.0:8081/healthz

Without --kubeconfig it uses $KUBECONFIG, ~/.kube/config, or the pod's ServiceAccount. Kubeconfig users
may authenticate with a token, a client certificate, an exec plugin (aws eks get-token, kubelogin,
gke-gcloud-auth-plugin) or an auth-provider (gcp, oidc): the `kubernetes` package loads them
(operator/kube.py), and expiring tokens are fetched again.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from collections.abc import Sequence

from .render import BROKER_IMAGE_ENV


def priority(value: str) -> int:
    if value == "random":
        return secrets.randbelow(2**31 - 1) + 1
    return int(value)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fleetmq-operator", description="Run the fleetmq Kubernetes operator.")
    p.add_argument(
        "--kubeconfig", metavar="FILE", help="kubeconfig to use (default: $KUBECONFIG, in-cluster)"
    )
    p.add_argument("--context", metavar="NAME", help="kubeconfig context (default: its current-context)")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "-n", "--namespace", action="append", metavar="NS", help="watch this namespace (repeatable; globs ok)"
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace (default)")
    peering = p.add_mutually_exclusive_group()
    peering.add_argument(
        "--peering", metavar="NAME", help="kopf peering object for HA: one active operator among replicas"
    )
    peering.add_argument("--standalone", action="store_true", help="no peering (a single replica)")
    p.add_argument(
        "--priority",
        type=priority,
        default=0,
        help="peering priority (highest one is active; replicas of equal priority all pause); 'random': "
        "one per process, so the replicas of a Deployment differ",
    )
    p.add_argument(
        "--liveness", metavar="URL", help="serve kopf's liveness probe, e.g. http://0.0.0.0:8081/healthz"
    )
    p.add_argument("--metrics", metavar="HOST:PORT", help="serve the operator's Prometheus /metrics here")
    p.add_argument(
        "--resync", type=float, metavar="SECONDS", help="full resync interval per fleet (default 30)"
    )
    p.add_argument(
        "--broker-image",
        metavar="IMAGE",
        help="the broker image of fleets that name none (default: fleetmq/broker:<this version>)",
    )
    p.add_argument(
        "--manage-crds",
        action="store_true",
        help="at start, update the fleetmq CRDs to this operator's schemas (never to older ones)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    return p.parse_args(argv)


def kopf_args(args: argparse.Namespace) -> list[str]:
    """The `kopf run` command line for these flags."""
    out = ["run", "--module", "fleetmq.operator.handlers"]
    if args.namespace:
        for ns in args.namespace:
            out += ["--namespace", ns]
    else:
        out.append("--all-namespaces")
    if args.peering:
        out += ["--peering", args.peering, "--priority", str(args.priority)]
    else:
        out.append("--standalone")
    if args.liveness:
        out += ["--liveness", args.liveness]
    if args.verbose:
        out.append("--verbose")
    if args.quiet:
        out.append("--quiet")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = os.path.abspath(args.kubeconfig)
    if args.context:
        os.environ["FLEETMQ_KUBE_CONTEXT"] = args.context
    if args.resync:
        os.environ["FLEETMQ_RESYNC_SECONDS"] = str(args.resync)
    if args.manage_crds:
        os.environ["FLEETMQ_MANAGE_CRDS"] = "true"
    if args.broker_image:
        os.environ[BROKER_IMAGE_ENV] = args.broker_image
    if args.metrics:
        from .metrics import serve

        serve(args.metrics)
    import kopf.cli

    try:
        kopf.cli.main(args=kopf_args(args), prog_name="fleetmq-operator", standalone_mode=False)
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
