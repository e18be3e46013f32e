"""Checks of the gateway's route for the OpenAI-compatible HTTP API (/v1/,
drt-server's --openai_listen) on rendered objects; k8s_render_test.py
renders deploy/k8s and calls them. Static only: no Envoy runs here, so these
check what envoy.yaml says, not what Envoy does.
"""
import re

import gateway_checks
from gateway_checks import ENVOY_DEFAULT_THRESHOLD

# The path prefix of every OpenAI API request drt-server serves
# (POST /v1/completions, GET /v1/models; docs/api.md).
OPENAI_PREFIX = "/v1/"
# HttpConnectionManager.stream_idle_timeout when unset (its proto: 5 minutes).
ENVOY_DEFAULT_STREAM_IDLE_SECONDS = 300


def seconds(duration):
    """An Envoy Duration as YAML gives it ("3600s", "0.25s") in seconds."""
    return float(str(duration).rstrip("s"))


def client_route_tables(envoy):
    """[(the HttpConnectionManager, its routes)] for each filter chain of the
    client listener."""
    out = []
    for chain in gateway_checks.grpc_listener(envoy)["filter_chains"]:
        hcm = chain["filters"][0]["typed_config"]
        out.append((hcm, [r for vh in hcm["route_config"]["virtual_hosts"] for r in vh["routes"]]))
    return out


def routed_clusters(envoy):
    """The names of the clusters the client listener routes to."""
    return {r["route"]["cluster"] for _, routes in client_route_tables(envoy) for r in routes if "route" in r}


def default_thresholds(cluster):
    thresholds = cluster.get("circuit_breakers", {}).get("thresholds", [])
    return next((t for t in thresholds if t.get("priority", "DEFAULT") == "DEFAULT"), {})


def openai_route(c, name, envoy):
    """The /v1/ route of each filter chain, checked to come before the
    catch-all gRPC route (Envoy takes the first route that matches).
    Returns (route, its HttpConnectionManager) of the first chain, or None."""
    found = None
    for hcm, routes in client_route_tables(envoy):
        prefixes = [r.get("match", {}).get("prefix") for r in routes]
        v1 = prefixes.index(OPENAI_PREFIX) if OPENAI_PREFIX in prefixes else None
        root = prefixes.index("/") if "/" in prefixes else None
        c.expect(v1 is not None and root is not None and v1 < root,
                 f"{name}: the client listener routes prefix {OPENAI_PREFIX} before the catch-all / (gRPC)",
                 str(prefixes))
        if v1 is not None and found is None:
            found = (routes[v1], hcm)
    return found


def check_openai_gateway(c, name, envoy, server_container, headless_name, default_sessions, pods, why, facts):
    """The gateway sends /v1/ to the pods' OpenAI API port: the pods the
    headless Service lists, least-request balanced (the requests are
    stateless: a temporary session each, so no hash policy), HTTP/1.1 (what
    the API speaks), with no route timeout and a stated idle timeout above
    the engine's stall limit, /healthz of the probe port as its health
    check, and circuit breakers sized as the gRPC cluster's: each running
    completion holds a session on its pod, so --max_sessions x pods requests
    (and, over HTTP/1.1, as many connections) may be open at once."""
    found = openai_route(c, name, envoy)
    if found is None:
        return
    route, hcm = found
    action = route.get("route", {})
    clusters = {cl["name"]: cl for cl in envoy["static_resources"]["clusters"]}
    cluster = clusters.get(action.get("cluster"))
    grpc_cluster = next((r["route"]["cluster"] for _, routes in client_route_tables(envoy) for r in routes
                         if r.get("match", {}).get("prefix") == "/"), None)
    c.expect(cluster is not None and action.get("cluster") != grpc_cluster and not action.get("hash_policy"),
             f"{name}: /v1/ goes to a cluster of its own ({action.get('cluster')}), not the gRPC ring "
             f"({grpc_cluster}), with no hash policy", str(action))
    if cluster is None:
        return

    # Timeouts: none on the whole request (a streamed answer lasts as long as
    # generation); an idle timeout, stated, that no healthy engine step can
    # reach (a step of up to --engine_stall_seconds sends no byte).
    env = {e["name"]: e for e in server_container.get("env", [])}
    stall = int(env.get("DRT_ENGINE_STALL_SECONDS", {}).get("value", facts["engine_stall_default"]))
    idle = action.get("idle_timeout", hcm.get("stream_idle_timeout"))
    idle_seconds = seconds(idle) if idle is not None else ENVOY_DEFAULT_STREAM_IDLE_SECONDS
    c.expect(action.get("timeout") in ("0s", 0), f"{name}: no route timeout on /v1/ (streams)",
             str(action.get("timeout")))
    c.expect(idle is not None and idle_seconds > stall,
             f"{name}: /v1/'s idle timeout is stated ({idle}) and above --engine_stall_seconds ({stall} s), "
             f"the longest a healthy step keeps a stream silent (Envoy's default is {ENVOY_DEFAULT_STREAM_IDLE_SECONDS} s)")

    # Where it goes: every pod the headless Service lists, on its openai port.
    ports = {p["name"]: p["containerPort"] for p in server_container["ports"]}
    endpoints = [e for group in cluster.get("load_assignment", {}).get("endpoints", [])
                 for e in group.get("lb_endpoints", [])]
    addresses = [e["endpoint"]["address"]["socket_address"] for e in endpoints]
    c.expect(cluster.get("type") == "STRICT_DNS" and endpoints
             and all(a["address"] == headless_name and a["port_value"] == ports.get("openai") for a in addresses),
             f"{name}: {cluster['name']} resolves the headless Service {headless_name}'s pods on their openai port "
             f"{ports.get('openai')}", str(addresses))
    c.expect(cluster.get("lb_policy") == "LEAST_REQUEST",
             f"{name}: {cluster['name']} balances by least requests (stateless calls)", str(cluster.get("lb_policy")))
    options = (cluster.get("typed_extension_protocol_options", {})
               .get("envoy.extensions.upstreams.http.v3.HttpProtocolOptions", {}).get("explicit_http_config", {}))
    c.expect("http_protocol_options" in options and "http2_protocol_options" not in options,
             f"{name}: {cluster['name']} speaks HTTP/1.1 to the pods (drt-server's API speaks nothing else)",
             str(options))

    # Health: /healthz of the probe port (503 from a drain's start).
    server_grace = int(env["DRT_SHUTDOWN_GRACE_SECONDS"]["value"])
    checks = cluster.get("health_checks", [])
    http_checks = [h for h in checks if "http_health_check" in h]
    c.expect(len(checks) == 1 and len(http_checks) == 1
             and http_checks[0]["http_health_check"].get("path") == "/healthz" and "/healthz" in facts["http_paths"]
             and http_checks[0].get("reuse_connection") is False,
             f"{name}: {cluster['name']} checks GET /healthz, a new connection each time (the probe endpoint serves "
             "one request per connection)", str(checks))
    c.expect(all(e["endpoint"].get("health_check_config", {}).get("port_value") == ports.get("http")
                 for e in endpoints),
             f"{name}: {cluster['name']}'s health checks go to the pods' http port {ports.get('http')} (--http_listen), "
             "not the API's", str([e["endpoint"].get("health_check_config") for e in endpoints]))
    if http_checks:
        out_within = seconds(http_checks[0]["interval"]) + seconds(http_checks[0]["timeout"])
        c.expect(out_within < server_grace,
                 f"{name}: a draining pod's 503 takes it out of {cluster['name']} within interval + timeout = "
                 f"{out_within:g} s, inside drt-server's {server_grace} s drain")
    tcp = cluster.get("upstream_connection_options", {}).get("tcp_keepalive", {})
    c.expect(all(k in tcp for k in ("keepalive_time", "keepalive_interval", "keepalive_probes")),
             f"{name}: TCP keepalive on {cluster['name']}'s connections (a pod lost without a FIN)", str(tcp))

    # Circuit breakers: --max_sessions x pods requests, and as many
    # connections (HTTP/1.1, one request per connection).
    sessions, source = gateway_checks.max_sessions(server_container, default_sessions)
    c.expect(sessions is not None, f"{name}: the server's --max_sessions can be read from the manifests", source)
    if sessions is None:
        return
    needed = sessions * pods
    got = {k: int(default_thresholds(cluster).get(k, ENVOY_DEFAULT_THRESHOLD))
           for k in ("max_requests", "max_pending_requests", "max_connections")}
    c.expect(all(v >= needed for v in got.values()),
             f"{name}: {cluster['name']}'s circuit breakers {got} each >= {sessions} sessions ({source}) x {pods} pods "
             f"({why}) = {needed}", "(1024 where unset: Envoy's default)")


def service_port(objects, name, target):
    """The port of Service `name` whose targetPort is `target` (a number or a
    name of the gateway container's ports), or None."""
    service = objects.get(("Service", name))
    if service is None:
        return None
    (container,) = objects[("Deployment", "drt-gateway")]["spec"]["template"]["spec"]["containers"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    return next((p["port"] for p in service["spec"]["ports"] if named.get(p["targetPort"], p["targetPort"]) == target),
                None)


def check_openai_docs(c, docs_text, plain, tls):
    """docs/deploy.md shows a curl of /v1/completions through the gateway,
    in plaintext through `kubectl port-forward` of Service drt-gateway, and
    over TLS (--cacert, https) to the TLS example's external Service, each
    on the port those Services really give the client listener, with the
    bearer token."""
    # Commands continue over lines ending in a backslash.
    text = docs_text.replace("\\\n", " ")
    _, envoy = gateway_checks.envoy_of(plain)
    listener_port = gateway_checks.grpc_listener(envoy)["address"]["socket_address"]["port_value"]
    port = service_port(plain, "drt-gateway", listener_port)
    forwards = {(int(a), int(b)) for a, b in re.findall(r"kubectl -n \S+ port-forward svc/drt-gateway (\d+):(\d+)", text)}
    plain_curls = [(int(p), line) for line in text.splitlines()
                   for p in re.findall(r"\bcurl\b.*\bhttp://localhost:(\d+)/v1/completions", line)]
    ok = [p for p, line in plain_curls if (p, port) in forwards and 'Authorization: Bearer' in line]
    c.expect(port is not None and ok,
             f"docs/deploy.md: a curl of http://localhost:{port}/v1/completions with the bearer token, through "
             f"`kubectl -n drt port-forward svc/drt-gateway {port}:{port}` (the gateway Service's client port)",
             f"curls {[p for p, _ in plain_curls]}, port-forwards {sorted(forwards)}")
    external = service_port(tls, "drt-gateway-external", listener_port) if tls else None
    tls_curls = [int(p) for line in text.splitlines()
                 for p in re.findall(r"\bcurl\b.*--cacert \S+ https://[\w.-]+:(\d+)/v1/completions.*"
                                     r"Authorization: Bearer", line)]
    c.expect(external is not None and external in tls_curls,
             f"docs/deploy.md: a curl of https://...:{external}/v1/completions with --cacert and the bearer token "
             "(the TLS example's external Service port)", f"TLS curls on ports {tls_curls}")
