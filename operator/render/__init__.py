"""Pure rendering: a BrokerFleet and what it serves -> the broker config file and the child manifests.

No I/O here, so every decision the operator makes about what to run is unit-tested. What goes where:
- Everything a broker applies live (zones, ACLs, users, listeners) lives only in the ConfigMap, which the
  kubelet refreshes in the pods, so changing it never changes the pod template; so do the Secrets every pod
  mounts whatever the fleet holds (the bridges' files, the MqttUsers' password hashes).
- What a broker reads only at start (store, metrics bind, event log) is hashed into the pod template's
  `fleetmq.io/restart-hash` annotation: changing it rolls the pods one at a time.
- The operator version appears nowhere in the pods, so upgrading the operator restarts no broker.

Modules: select (which zones, bridges and users go in), config (the config file and its ConfigMap),
secrets, pods (what every pod gets), broker (the brokers' StatefulSet), services, redis (the managed
Redis), fleet (render: all of it), common (names, labels, paths).
"""

from ..rollout import L_SERVING
from .broker import A_RESTART_HASH, BROKER_IMAGE_ENV, broker_image, statefulset
from .certificates import hold_back
from .common import (
    API_ADMIN_KEY,
    CONFIG_DIR,
    CONFIG_KEY,
    L_COMPONENT,
    L_FLEET,
    L_INSTANCE,
    L_MANAGED,
    MANAGER,
    PASSWORD_KEY,
    PAUSED,
    Fleet,
    RenderError,
    dns_name,
    labels,
    names,
    paused,
    redis_pods,
    selector_labels,
    selector_string,
)
from .config import A_CONFIG_HASH, A_ZONE_GENERATIONS, applied_bridges, applied_zones, history, user_history
from .fleet import Rendered, render
from .pods import RESTRICTED_CONTAINER
from .redis import (
    L_REDIS_MODE,
    SCRIPT_PATH,
    SCRIPT_TEXT,
    check_redis_topology,
    quantity_bytes,
    redis_auth_secret,
    store_workloads,
)
from .secrets import (
    api_keys_secret,
    bridge_secret,
    bridge_secret_files,
    user_file_entries,
    user_password_secret,
)
from .select import Bridge, Rejection, User, Zone, select_bridges, select_users, select_zones

__all__ = [
    "API_ADMIN_KEY",
    "A_CONFIG_HASH",
    "A_RESTART_HASH",
    "A_ZONE_GENERATIONS",
    "BROKER_IMAGE_ENV",
    "CONFIG_DIR",
    "CONFIG_KEY",
    "L_COMPONENT",
    "L_FLEET",
    "L_INSTANCE",
    "L_MANAGED",
    "L_REDIS_MODE",
    "L_SERVING",
    "MANAGER",
    "PASSWORD_KEY",
    "PAUSED",
    "RESTRICTED_CONTAINER",
    "SCRIPT_PATH",
    "SCRIPT_TEXT",
    "Bridge",
    "Fleet",
    "Rejection",
    "RenderError",
    "Rendered",
    "User",
    "Zone",
    "api_keys_secret",
    "applied_bridges",
    "applied_zones",
    "bridge_secret",
    "bridge_secret_files",
    "broker_image",
    "check_redis_topology",
    "dns_name",
    "history",
    "hold_back",
    "labels",
    "names",
    "paused",
    "quantity_bytes",
    "redis_auth_secret",
    "redis_pods",
    "render",
    "select_bridges",
    "select_users",
    "select_zones",
    "selector_labels",
    "selector_string",
    "statefulset",
    "store_workloads",
    "user_file_entries",
    "user_history",
    "user_password_secret",
]
