"""Checks of the Envoy gateway's TLS and sizing (review-deploy #4, #7) on
rendered objects; k8s_render_test.py renders deploy/k8s and calls them.
Static only: no Envoy runs here, so these check what the manifests say, not
what Envoy does.
"""
import copy
import ipaddress
import os
import re

import yaml

# The keys of a Secret of type kubernetes.io/tls (`kubectl create secret tls`).
TLS_SECRET_KEYS = {"certificate_chain": "tls.crt", "private_key": "tls.key"}
EXPOSED_TYPES = ("LoadBalancer", "NodePort")
LOOPBACK = {4: ipaddress.ip_network("127.0.0.0/8"), 6: ipaddress.ip_network("::1/128")}
# Envoy's circuit breaker defaults where a cluster sets none
# (config.cluster.v3.CircuitBreakers.Thresholds: 1024 each).
ENVOY_DEFAULT_THRESHOLD = 1024


def envoy_of(objects):
    """The gateway's ConfigMap and its envoy.yaml, parsed."""
    (config_map,) = [o for (kind, _), o in objects.items() if kind == "ConfigMap"]
    return config_map, yaml.safe_load(config_map["data"]["envoy.yaml"])


def grpc_listener(envoy):
    return next(l for l in envoy["static_resources"]["listeners"] if l["name"] == "grpc")


def exposed_services(objects):
    """Services reachable from outside the cluster: LoadBalancer, NodePort,
    or with externalIPs."""
    return {name: o for (kind, name), o in objects.items() if kind == "Service"
            and (o["spec"].get("type", "ClusterIP") in EXPOSED_TYPES or o["spec"].get("externalIPs"))}


def check_plaintext_internal(c, objects, service_text):
    """The plain gateway's client listener is plaintext HTTP/2: the bearer
    token and every prompt cross the wire in clear, so none of its Services
    reach outside the cluster, and service.yaml says so instead of
    suggesting a LoadBalancer (review-deploy #4)."""
    _, envoy = envoy_of(objects)
    plaintext = not any("transport_socket" in chain for chain in grpc_listener(envoy)["filter_chains"])
    exposed = sorted(exposed_services(objects))
    c.expect(plaintext and not exposed,
             "gateway: its grpc listener is plaintext and no Service exposes it outside the cluster "
             "(ClusterIP only)", f"plaintext {plaintext}, exposed {exposed}")
    comment = " ".join(" ".join(re.findall(r"^#(.*)$", service_text, re.M)).split())
    c.expect(re.search(r"cluster-internal", comment, re.I) and re.search(r"in clear", comment)
             and "examples/gateway-tls" in comment and not re.search(r"\bMake it a LoadBalancer", comment),
             "gateway/service.yaml: says the plaintext port is cluster-internal (token and prompts in clear) "
             "and points at examples/gateway-tls", comment[:300])


def is_loopback_range(cidr):
    """Whether a config.core.v3.CidrRange lies within loopback (prefix_len
    unset is 0: every address); False for one that does not parse."""
    try:
        network = ipaddress.ip_network(f"{cidr.get('address_prefix')}/{cidr.get('prefix_len', 0)}", strict=False)
    except ValueError:
        return False
    return network.subnet_of(LOOPBACK[network.version])


def check_internal_addresses(c, name, envoy):
    """With use_remote_address, Envoy strips the x-envoy-* headers (retry
    policy, upstream timeout) of requests from addresses it does not count
    as internal. Which those are depends on the version when
    internal_address_config is unset (RFC1918 until 1.33, none since), and
    an internal_address_config without cidr_ranges means RFC1918 (its
    proto's comment). So the client listener lists its internal ranges, and
    they hold loopback alone (review-gateway #4)."""
    for chain in grpc_listener(envoy)["filter_chains"]:
        hcm = chain["filters"][0]["typed_config"]
        ranges = hcm.get("internal_address_config", {}).get("cidr_ranges", [])
        loopback = all(is_loopback_range(r) for r in ranges)
        c.expect(hcm.get("use_remote_address") is True and ranges and loopback,
                 f"{name}: the client listener takes the peer's address (use_remote_address) and counts only "
                 "loopback as internal (internal_address_config.cidr_ranges), so no client's x-envoy-* headers are "
                 "trusted whatever the Envoy version's default", str(hcm.get("internal_address_config")))


def tls_contexts(listener):
    """The DownstreamTlsContext of each filter chain (None where a chain has
    no TLS transport socket)."""
    out = []
    for chain in listener["filter_chains"]:
        socket = chain.get("transport_socket", {})
        config = socket.get("typed_config", {})
        ok = (socket.get("name") == "envoy.transport_sockets.tls"
              and config.get("@type", "").endswith(".tls.v3.DownstreamTlsContext"))
        out.append(config if ok else None)
    return out


def certificates(common, config_map, config_mount):
    """The TlsCertificate messages a CommonTlsContext serves: inline
    tls_certificates (Envoy never reloads these), and file-based SDS
    resources (path_config_source) read from the gateway's ConfigMap, marked
    as SDS-delivered. Returns [(certificate, via_sds)] and a list of
    problems."""
    found, problems = [(cert, False) for cert in common.get("tls_certificates", [])], []
    for sds in common.get("tls_certificate_sds_secret_configs", []):
        path = sds.get("sds_config", {}).get("path_config_source", {}).get("path", "")
        key = os.path.relpath(path, config_mount) if path.startswith(config_mount.rstrip("/") + "/") else None
        if key not in config_map["data"]:
            problems.append(f"SDS secret {sds.get('name')}: {path or 'no path_config_source'} is not a file of the "
                            f"mounted ConfigMap ({config_mount})")
            continue
        resources = (yaml.safe_load(config_map["data"][key]) or {}).get("resources", [])
        named = [r for r in resources if r.get("name") == sds.get("name")
                 and r.get("@type", "").endswith(".tls.v3.Secret") and "tls_certificate" in r]
        if len(named) != 1:
            problems.append(f"{key}: no single Secret resource named {sds.get('name')} with a tls_certificate")
            continue
        found.append((named[0]["tls_certificate"], True))
    return found, problems


# Kubernetes' default mode of a secret volume's files (0644).
SECRET_DEFAULT_MODE = 0o644


def secret_file_access(pod, container, secret, key):
    """Whether the container's user can read key of a secret volume, and
    whether every user can, as kubelet lays the files out: owned by root,
    mode the item's mode, else defaultMode, else 0644; with a pod fsGroup the
    file's group is fsGroup and kubelet adds group read (SetVolumeOwnership),
    and fsGroup is one of every container's supplementary groups, so any
    fsGroup makes it readable; without one the group is root's. The process
    runs as runAsUser/runAsGroup (container over pod), plus
    supplementalGroups (review-gateway #2). Returns (readable,
    world_readable, a description)."""
    pod_ctx, ctx = pod.get("securityContext", {}), container.get("securityContext", {})
    uid = ctx.get("runAsUser", pod_ctx.get("runAsUser"))
    gid = ctx.get("runAsGroup", pod_ctx.get("runAsGroup"))
    fs_group = pod_ctx.get("fsGroup")
    mode = next((i["mode"] for i in secret.get("items", []) if i["key"] == key and "mode" in i),
                secret.get("defaultMode", SECRET_DEFAULT_MODE))
    file_group = 0
    if fs_group is not None:
        file_group, mode = fs_group, mode | 0o440
    groups = set(pod_ctx.get("supplementalGroups", [])) | {g for g in (gid, fs_group) if g is not None}
    readable = bool((uid == 0 and mode & 0o400) or (file_group in groups and mode & 0o040) or mode & 0o004)
    return readable, bool(mode & 0o004), (f"file root:{file_group} mode {mode:04o}; process uid {uid}, groups "
                                          f"{sorted(groups)} (fsGroup {fs_group})")


def without_tls(envoy):
    """envoy.yaml with the grpc listener's transport sockets taken out."""
    out = copy.deepcopy(envoy)
    for chain in grpc_listener(out)["filter_chains"]:
        chain.pop("transport_socket", None)
    return out


def check_tls(c, objects, plain, docs_text):
    """deploy/k8s/examples/gateway-tls: Envoy terminates TLS on the client
    listener with a certificate and key from a Secret mounted read-only, and
    reloads them when the Secret is renewed; nothing else differs from the
    plain gateway; only the TLS port leaves the cluster (review-deploy #4)."""
    name = "examples/gateway-tls"
    c.expect(objects is not None, f"{name}: the TLS gateway example exists (deploy/k8s/{name})")
    if objects is None:
        return
    config_map, envoy = envoy_of(objects)
    deployment = objects[("Deployment", "drt-gateway")]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"].rstrip("/"): m for m in container["volumeMounts"]}
    config_mount = next(path for path, m in mounts.items()
                        if volumes[m["name"]].get("configMap", {}).get("name") == config_map["metadata"]["name"])

    contexts = tls_contexts(grpc_listener(envoy))
    c.expect(contexts and all(contexts),
             f"{name}: every filter chain of listener grpc has a TLS transport_socket (DownstreamTlsContext)",
             str([chain.get("transport_socket") for chain in grpc_listener(envoy)["filter_chains"]]))
    commons = [ctx.get("common_tls_context", {}) for ctx in contexts if ctx]
    # Envoy picks the first protocol of its own list that the client offers:
    # h2 first, so gRPC clients (and curl, which offers both) get HTTP/2;
    # http/1.1 for OpenAI API clients that speak only that.
    c.expect(commons and all(cc.get("alpn_protocols") == ["h2", "http/1.1"] for cc in commons),
             f"{name}: ALPN offers h2 first (gRPC's HTTP/2), then http/1.1 (OpenAI API clients on /v1/)",
             str([cc.get("alpn_protocols") for cc in commons]))

    served, problems = [], []
    for common in commons:
        found, bad = certificates(common, config_map, config_mount)
        served += found
        problems += bad
    c.expect(served and not problems, f"{name}: the TLS contexts name their certificates (inline or file SDS "
             "from the ConfigMap)", "; ".join(problems))
    secrets = set()
    for cert, via_sds in served:
        for field, secret_key in TLS_SECRET_KEYS.items():
            path = cert.get(field, {}).get("filename", "")
            mount = mounts.get(os.path.dirname(path))
            volume = volumes.get(mount["name"], {}) if mount else {}
            secret = volume.get("secret", {})
            mapped = {i["path"]: i["key"] for i in secret.get("items", [])} or None
            key = mapped.get(os.path.basename(path)) if mapped else os.path.basename(path)
            ok = bool(secret.get("secretName")) and mount.get("readOnly") is True and key == secret_key
            if ok:
                secrets.add(secret["secretName"])
            c.expect(ok, f"{name}: {field} {path or '(none)'} is key {secret_key} of a Secret mounted read-only",
                     f"mount {mount}, volume {volume}")
            if ok:
                readable, world, detail = secret_file_access(pod, container, secret, key)
                c.expect(readable, f"{name}: Envoy's user can read {path} (else the SDS secret never loads and "
                         "the listener serves no TLS)", detail)
                if field == "private_key":
                    c.expect(not world, f"{name}: the private key {path} is not readable by every user", detail)
        watched = cert.get("watched_directory", {}).get("path", "").rstrip("/")
        cert_dir = os.path.dirname(cert.get("certificate_chain", {}).get("filename", ""))
        c.expect(via_sds and watched == cert_dir,
                 f"{name}: the certificate comes through file SDS with watched_directory {cert_dir} (the Secret "
                 "mount, whose ..data link kubelet swaps), so Envoy reloads a renewed Secret without a restart",
                 f"SDS {via_sds}, watched_directory {watched or None}")
    documented = set(re.findall(r"kubectl -n [a-z0-9-]+ create secret tls ([a-z0-9-]+)", docs_text))
    c.expect(secrets and secrets <= documented,
             f"{name}: docs/deploy.md shows how to create the Secret {sorted(secrets)} "
             "(`kubectl -n drt create secret tls NAME`)", f"documented: {sorted(documented)}")

    # Nothing else changes: Envoy's config and the pod are the plain gateway's.
    plain_map, plain_envoy = envoy_of(plain)
    c.expect(without_tls(envoy) == plain_envoy and config_map["data"].get("drain.sh") == plain_map["data"]["drain.sh"],
             f"{name}: otherwise deploy/k8s/gateway's Envoy (routes, ring, health checks, admin) and drain.sh")
    plain_pod = copy.deepcopy(plain[("Deployment", "drt-gateway")]["spec"]["template"]["spec"])
    mine = copy.deepcopy(pod)
    tls_volumes = {v for v, spec in volumes.items() if "secret" in spec}
    mine["volumes"] = [v for v in mine["volumes"] if v["name"] not in tls_volumes and "configMap" not in v]
    plain_pod["volumes"] = [v for v in plain_pod["volumes"] if "configMap" not in v]
    mine["containers"][0]["volumeMounts"] = [m for m in mine["containers"][0]["volumeMounts"]
                                             if m["name"] not in tls_volumes]
    mine["securityContext"].pop("fsGroup", None)
    c.expect(mine == plain_pod, f"{name}: otherwise the plain gateway's pod (image, drain, probes, security)",
             f"\n  mine:  {mine}\n  plain: {plain_pod}")

    # Which Services carry what: TLS outside, no cleartext port outside.
    grpc_port = grpc_listener(envoy)["address"]["socket_address"]["port_value"]
    port_names = {p["name"]: p["containerPort"] for p in container["ports"]}
    target = lambda p: port_names.get(p["targetPort"], p["targetPort"])
    exposed = exposed_services(objects)
    leaks = [f"{n}:{p['port']}" for n, o in exposed.items() for p in o["spec"]["ports"] if target(p) != grpc_port]
    c.expect(exposed and not leaks,
             f"{name}: a LoadBalancer Service exposes the TLS port alone (metrics stay cluster-internal)",
             f"exposed {sorted(exposed)}, other ports {leaks}")
    h2c = [f"{n}:{p['port']}" for (kind, n), o in objects.items() if kind == "Service"
           for p in o["spec"]["ports"] if target(p) == grpc_port and p.get("appProtocol") == "kubernetes.io/h2c"]
    c.expect(not h2c, f"{name}: no Service calls the TLS port cleartext HTTP/2 (appProtocol kubernetes.io/h2c)",
             str(h2c))


# --max_sessions on a command line, as absl parses it: one or two dashes,
# the value after '=' or in the next argument.
MAX_SESSIONS_FLAG = re.compile(r"--?max_sessions(=(.*))?")


def max_sessions(container, default):
    """--max_sessions of a drt-server container, as the image's entrypoint
    (deploy/image/entrypoint.sh) passes it: DRT_MAX_SESSIONS from env first,
    then the container's command and args, which come after it and win (the
    last one given counts); else the server's default. Returns (sessions,
    where it came from), or (None, the problem) where the manifests do not
    say: a valueFrom or envFrom (a ConfigMap or Secret's value is not in
    them), or a value that is not a whole number (review-gateway #1)."""
    if container.get("envFrom"):
        return None, f"envFrom {container['envFrom']} may set DRT_MAX_SESSIONS to a value the manifests do not show"
    found = (default, "the server's default")
    for e in container.get("env", []):
        if e["name"] == "DRT_MAX_SESSIONS":
            if "value" not in e:
                return None, f"env DRT_MAX_SESSIONS has no literal value ({e}); give one the render test can read"
            found = (e["value"], "env DRT_MAX_SESSIONS")
    words = [str(w) for w in container.get("command", []) + container.get("args", [])]
    for i, word in enumerate(words):
        m = MAX_SESSIONS_FLAG.fullmatch(word)
        if not m:
            continue
        if m.group(1) is None and i + 1 >= len(words):
            return None, f"argument {word} has no value after it"
        found = (m.group(2) if m.group(1) is not None else words[i + 1], f"argument {word}")
    value, source = found
    if not re.fullmatch(r"\d+", str(value)):
        return None, f"{source}: --max_sessions value {value!r} is not a whole number"
    return int(value), source


def surge_pods(deployment, replicas):
    """Pods a rolling update may add above the replica count (maxSurge,
    Kubernetes' default 25% rounded up)."""
    strategy = deployment["spec"].get("strategy", {})
    if strategy.get("type", "RollingUpdate") != "RollingUpdate":
        return 0
    surge = strategy.get("rollingUpdate", {}).get("maxSurge", "25%")
    if isinstance(surge, str) and surge.endswith("%"):
        return -(-int(surge[:-1]) * replicas // 100)
    return int(surge)


def check_circuit_breakers(c, name, cluster, container, default, pods, why):
    """Each running Append or Generate holds one Envoy request to the
    cluster for its whole length, and drt-server runs at most one call per
    session, so one gateway (the other may be draining) can hold sessions x
    pods long requests, sessions being the server container's
    --max_sessions (env or args, see max_sessions). The cluster's circuit
    breakers (Envoy's defaults: 1024) must not refuse them while the servers
    have room: past max_requests or max_pending_requests Envoy fails calls at
    once with UNAVAILABLE (review-deploy #7). Raising --max_sessions or the
    replica count without these fails here."""
    sessions, source = max_sessions(container, default)
    c.expect(sessions is not None, f"{name}: the server's --max_sessions can be read from the manifests", source)
    if sessions is None:
        return
    thresholds = cluster.get("circuit_breakers", {}).get("thresholds", [])
    default_thresholds = next((t for t in thresholds if t.get("priority", "DEFAULT") == "DEFAULT"), {})
    needed = sessions * pods
    got = {k: int(default_thresholds.get(k, ENVOY_DEFAULT_THRESHOLD)) for k in ("max_requests", "max_pending_requests")}
    c.expect(all(v >= needed for v in got.values()),
             f"{name}: circuit breakers max_requests {got['max_requests']} and max_pending_requests "
             f"{got['max_pending_requests']} >= {sessions} sessions ({source}) x {pods} pods ({why}) = {needed}",
             "(1024 where unset: Envoy's default)")


def cpu_cores(quantity):
    """A Kubernetes CPU quantity ("500m", "2", 1.5) in cores."""
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def check_concurrency(c, name, deployment, cluster, pods):
    """Envoy runs --concurrency worker threads, by default one per hardware
    thread of the node (192 on a large GPU node) whatever the pod's CPU
    request; each worker keeps its own HTTP/2 connection to every pod
    (review-deploy #7). So --concurrency is set, at most the CPU request in
    cores (at least 2 workers' worth), and max_connections covers one
    connection per worker per pod."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = container.get("args", [])
    value = args[args.index("--concurrency") + 1] if "--concurrency" in args[:-1] else None
    request = container.get("resources", {}).get("requests", {}).get("cpu")
    allowed = max(2, -(-cpu_cores(request) // 1)) if request is not None else 0
    workers = int(value) if value and value.isdigit() else 0
    c.expect(1 <= workers <= allowed,
             f"{name}: Envoy runs --concurrency {value} workers, sized to its CPU request {request} "
             f"(at most {allowed:g}), not one per node CPU", str(args))
    thresholds = cluster.get("circuit_breakers", {}).get("thresholds", [])
    default = next((t for t in thresholds if t.get("priority", "DEFAULT") == "DEFAULT"), {})
    connections = int(default.get("max_connections", ENVOY_DEFAULT_THRESHOLD))
    c.expect(workers and connections >= workers * pods,
             f"{name}: max_connections {connections} >= {workers} workers x {pods} pods (one HTTP/2 "
             "connection per worker per pod)")


# envoyproxy/envoy:vMAJOR.MINOR.PATCH, optionally pinned by digest as well.
EXACT_ENVOY_IMAGE = r"(docker\.io/)?envoyproxy/envoy:v\d+\.\d+\.\d+(@sha256:[0-9a-f]{64})?"


def check_envoy_image(c, name, deployment):
    """The gateway runs an exact Envoy release (review-deploy #7): a
    `v1.NN-latest` tag moves with each patch, so nodes that pulled it at
    different times (imagePullPolicy IfNotPresent) run different Envoys, and
    an old minor's tag stops getting fixes when its support ends."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    image = container["image"]
    c.expect(re.fullmatch(EXACT_ENVOY_IMAGE, image) is not None,
             f"{name}: the Envoy image is an exact release (vX.Y.Z, optionally @sha256 digest), not a moving tag",
             image)


# The HTTP/2 windows of Envoy's guide "Configuring Envoy as an edge proxy"
# (Envoy's own defaults: 256 MiB each).
EDGE_STREAM_WINDOW = 64 * 1024
EDGE_CONNECTION_WINDOW = 1024 * 1024


def memory_bytes(quantity):
    """A Kubernetes memory quantity ("1Gi", "256Mi") in bytes."""
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi)", str(quantity))
    if not m:
        raise SystemExit(f"memory quantity {quantity!r}: expected <number>Ki|Mi|Gi")
    return int(m.group(1)) * {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}[m.group(2)]


# The heap at which Envoy stops taking new requests (max_heap_size_bytes x
# the highest stop_accepting_requests threshold) may use at most this share of
# the container's memory limit. The rest is charged to the container's cgroup
# but not counted in tcmalloc's heap, which is all fixed_heap watches: the
# binary's resident pages, thread stacks, the kernel's socket buffers for up
# to 4096 client connections and the pods' connections, page cache. 20% (about
# 200 MiB of 1 GiB) is an allowance, not a measurement (no Envoy runs here):
# with less, stop_accepting_requests could fire only after the OOM kill it is
# there to prevent (review-gateway #3). The 768 MiB bound stops at 753 MiB.
HEAP_SHARE_OF_LIMIT = 0.8


def check_overload(c, name, envoy, deployment, cluster):
    """Envoy's overload manager watches its heap against a bound below the
    container's memory limit and stops taking new requests near it, so
    memory pressure gets 503s instead of an OOM kill that cuts every stream;
    client connections are capped; the HTTP/2 windows downstream and to the
    pods are the edge-proxy guide's, not Envoy's 256 MiB (review-deploy #7)."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    limit = container.get("resources", {}).get("limits", {}).get("memory")
    overload = envoy.get("overload_manager", {})
    monitors = {m["name"]: m.get("typed_config", {}) for m in overload.get("resource_monitors", [])}
    heap = int(monitors.get("envoy.resource_monitors.fixed_heap", {}).get("max_heap_size_bytes", 0))
    stop = [t.get("threshold", {}).get("value", 1) for a in overload.get("actions", [])
            if a["name"] == "envoy.overload_actions.stop_accepting_requests"
            for t in a.get("triggers", []) if t["name"] == "envoy.resource_monitors.fixed_heap"]
    stops_at = heap * max(stop) if stop else None
    allowed = HEAP_SHARE_OF_LIMIT * memory_bytes(limit) if limit is not None else 0
    c.expect(heap > 0 and stop and max(stop) < 1 and stops_at <= allowed,
             f"{name}: new requests stop at {max(stop) if stop else None} of the overload manager's heap bound "
             f"({heap} bytes), {stops_at or 0:.0f} bytes, at most {HEAP_SHARE_OF_LIMIT:g} of the container's memory "
             f"limit {limit} ({allowed:.0f} bytes; the rest for memory outside tcmalloc's heap)",
             str(overload)[:300])
    probed = {p.get("httpGet", {}).get("port") for p in (container.get("readinessProbe", {}),
                                                          container.get("livenessProbe", {}))}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probe_ports = {ports.get(p, p) for p in probed if p is not None}
    listeners = [l for l in envoy["static_resources"]["listeners"]
                 if l["address"]["socket_address"]["port_value"] in probe_ports]
    c.expect(listeners and all(l.get("bypass_overload_manager") is True and l.get("ignore_global_conn_limit") is True
                               for l in listeners),
             f"{name}: the listener kubelet probes (port {sorted(probe_ports)}) bypasses the overload manager and "
             "the connection cap (an overloaded Envoy is not restarted by its liveness probe)",
             str([(l["name"], l.get("bypass_overload_manager"), l.get("ignore_global_conn_limit")) for l in listeners]))
    connections = monitors.get("envoy.resource_monitors.global_downstream_max_connections", {})
    cap = int(connections.get("max_active_downstream_connections", 0))
    # Clients that each run one call on their own connection (every HTTP/1.1
    # client of the OpenAI API does) must not be refused by the cap while
    # the circuit breakers have room: the cap covers the max_requests of
    # every cluster the client listener routes to, together.
    routed = sorted({r["route"]["cluster"] for chain in grpc_listener(envoy)["filter_chains"]
                     for vh in chain["filters"][0]["typed_config"]["route_config"]["virtual_hosts"]
                     for r in vh["routes"] if "route" in r})
    requests = {}
    for cl in envoy["static_resources"]["clusters"]:
        if cl["name"] in routed:
            thresholds = cl.get("circuit_breakers", {}).get("thresholds", [])
            default = next((t for t in thresholds if t.get("priority", "DEFAULT") == "DEFAULT"), {})
            requests[cl["name"]] = int(default.get("max_requests", ENVOY_DEFAULT_THRESHOLD))
    c.expect(cap >= sum(requests.values()),
             f"{name}: client connections are capped (global_downstream_max_connections {cap}), at no fewer than "
             f"the max_requests of the routed clusters together {requests} (one connection per call fits)",
             str(connections))
    hcm = grpc_listener(envoy)["filter_chains"][0]["filters"][0]["typed_config"]
    upstream = (cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
                .get("explicit_http_config", {}).get("http2_protocol_options", {}))
    for side, options in (("clients", hcm.get("http2_protocol_options", {})), ("pods", upstream)):
        stream = int(options.get("initial_stream_window_size", 2**28))
        conn = int(options.get("initial_connection_window_size", 2**28))
        c.expect(stream <= EDGE_STREAM_WINDOW and conn <= EDGE_CONNECTION_WINDOW,
                 f"{name}: HTTP/2 windows toward the {side} at most the edge-proxy guide's 64 KiB per stream and "
                 f"1 MiB per connection (Envoy's default 256 MiB)", f"{stream} / {conn}")
