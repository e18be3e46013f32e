#!/usr/bin/env python3
"""Renders deploy/k8s with `kubectl kustomize` and checks the objects.

What the manifests must agree with is read from its source, not restated:
the image's non-root uid from deploy/Dockerfile, drt-server's flags from
server/server_flags.cc, its metric names from server/metrics.cc, its forced
stop and forced-exit slacks from server/main.cc, the routing header from the
Python client, the gateway drain hook's time bound from its own header.
No cluster is involved (none exists here). Exits 77 (ctest: skipped) when no
kubectl is installed. With no --kubectl and a kubectl newer than Debian 12's
1.20 on PATH, it also renders with Debian's at $KUBECTL_DEBIAN or
/opt/debian-kubectl/usr/bin/kubectl, and prints "NOT CHECKED" when there is
none.

    k8s_render_test.py [--kubectl kubectl]...
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

import yaml

from checks import Checks
import gateway_checks
import openai_gateway_checks

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
K8S = os.path.join(REPO, "deploy", "k8s")
# Where the test looks for Debian 12's kubectl (1.20, Kustomize 2.0.3) when the
# kubectl on PATH is newer: $KUBECTL_DEBIAN, else this path, which `dpkg-deb
# -x kubernetes-client_*.deb /opt/debian-kubectl` fills. Without it only the
# static `$patch:` scan guards 1.20, and other 2.0.3 gaps (`patches:`,
# `labels:`, ...) pass here (review-toolsfix #5). Nothing is downloaded.
DEBIAN_KUBECTL = "/opt/debian-kubectl/usr/bin/kubectl"
DEBIAN_KUBECTL_HOWTO = ("apt-get download kubernetes-client && dpkg-deb -x kubernetes-client_*.deb "
                        "/opt/debian-kubectl, or set KUBECTL_DEBIAN")


def read(path):
    with open(os.path.join(REPO, path)) as f:
        return f.read()


def source_facts():
    dockerfile = read("deploy/Dockerfile")
    uid = int(re.search(r"useradd [^\n]*--uid (\d+)", dockerfile).group(1))
    exposed = {int(p) for p in re.search(r"^EXPOSE ([\d ]+)$", dockerfile, re.M).group(1).split()}
    # The ports of the image's DRT_*LISTEN defaults (its ENV instruction,
    # continued over lines with a backslash): each must be EXPOSEd.
    env_block = re.search(r"^ENV ((?:[^\n]*\\\n)*[^\n]*)", dockerfile, re.M).group(1)
    image_listen = {m.group(1): int(m.group(2))
                    for m in re.finditer(r"\b(DRT_\w*LISTEN)=\S*:(\d+)\b", env_block)}
    flags = set(re.findall(r"ABSL_FLAG\(\s*[\w:<>]+\s*,\s*(\w+)\s*,", read("server/server_flags.cc")))
    metrics = set(re.findall(r'"(drt_[a-z_]+)"', read("server/metrics.cc")))
    main_cc = read("server/main.cc")
    # drt-server forces its exit at grace + stop slack + forced-exit slack
    # after SIGTERM (server/main.cc, WaitUntilDrained).
    stop_slack = int(re.search(r"kStopSlackSeconds = (\d+);", main_cc).group(1))
    slack = int(re.search(r"kForcedExitSlackSeconds = (\d+);", main_cc).group(1))
    drain_script = read("deploy/k8s/gateway/drain.sh")
    drain_bound = int(re.search(r"GATEWAY_DRAIN_DELAY_SECONDS \+ GATEWAY_DRAIN_SECONDS \+ (\d+) s",
                                drain_script).group(1))
    engine_health_service = re.search(r'kEngineHealthService\[\] = "([^"]+)"',
                                      read("server/engine_watchdog.h")).group(1)
    engine_stall_default = int(re.search(r"ABSL_FLAG\(int64_t, engine_stall_seconds, (\d+),",
                                         read("server/server_flags.cc")).group(1))
    min_client_ping_ms = int(re.search(r"kMinClientPingIntervalMs = ([\d']+);",
                                       read("server/grpc_keepalive.h")).group(1).replace("'", ""))
    http_paths = set(re.findall(r'server->Get\("([^"]+)"', read("server/http_endpoint.cc")))
    image_model = re.search(r"^ENV DRT_MODEL=(\S+)", dockerfile, re.M).group(1)
    copied = re.search(r"^COPY (\S+) " + re.escape(image_model) + r"$", dockerfile, re.M).group(1)
    header = re.search(r'SESSION_HEADER = "([^"]+)"', read("client_examples/python/drt_client.py")).group(1)
    # --max_sessions' default: the flag's own, or ServiceOptions' it names.
    flag = re.search(r"ABSL_FLAG\(int64_t, max_sessions, ([^,]+),", read("server/server_flags.cc")).group(1).strip()
    max_sessions = int(flag if flag.isdigit() else
                       re.search(r"struct ServiceOptions \{[^}]*?int64_t max_sessions = (\d+);",
                                 read("server/drt_service.h")).group(1))
    return dict(max_sessions=max_sessions, min_client_ping_ms=min_client_ping_ms, engine_health_service=engine_health_service, engine_stall_default=engine_stall_default,
                image_model=image_model, image_model_bytes=model_weight_bytes(copied), uid=uid, exposed=exposed,
                image_listen=image_listen, flags=flags, metrics=metrics, slack=slack, stop_slack=stop_slack,
                header=header, http_paths=http_paths, drain_script=drain_script, drain_bound=drain_bound)


def render(kubectl, directory):
    out = subprocess.run([kubectl, "kustomize", os.path.join(K8S, directory)],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise SystemExit(f"kubectl kustomize {directory} failed:\n{out.stderr}")
    objects = [o for o in yaml.safe_load_all(out.stdout) if o]
    # An object with no kind or name is something the kubectl did not
    # understand and printed as it was (Kustomize 2.0.3, Debian 12's kubectl,
    # leaves a `$patch: delete` patch in its output as such an object).
    for o in objects:
        if not isinstance(o, dict) or not o.get("kind") or not (o.get("metadata") or {}).get("name"):
            shown = yaml.safe_dump(o, default_flow_style=True, width=1000).strip()
            raise SystemExit(f"kubectl kustomize {directory}: an object with no kind or metadata.name in the "
                             f"output (a patch or field this kubectl does not know?): {shown[:400]}")
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def check_no_delete_patches(c):
    """Kustomize 2.0.3 (Debian 12's kubectl 1.20) has no `$patch: delete`:
    it leaves the patch in the output as an object with no kind, and
    `kubectl apply -k` would send it. Checked in the files, whatever kubectl
    renders them here."""
    found = []
    for root, _, files in os.walk(K8S):
        for f in sorted(files):
            if f.endswith((".yaml", ".yml")):
                path = os.path.join(root, f)
                with open(path) as fh:
                    if re.search(r"^\s*\$patch\s*:", fh.read(), re.M):
                        found.append(os.path.relpath(path, REPO))
    c.expect(not found, "no `$patch:` directive in deploy/k8s (Debian 12's kubectl cannot render one)",
             str(found))


# kubectl verbs whose objects live in a namespace: a documented command with
# one of these and no -n lands in `default` (review-deploy #8: monitoring and
# autoscaling applied there select nothing and scale nothing).
NAMESPACED_VERBS = {"apply", "rollout", "scale", "set", "port-forward", "get", "delete", "edit", "patch",
                    "label", "annotate", "logs", "exec", "describe"}


def check_namespaced_commands(c):
    """Every kubectl command in the deploy docs and the kustomizations' usage
    comments that acts on namespaced objects names the namespace."""
    files = ["README.md", "docs/deploy.md"]
    for root, _, names in os.walk(K8S):
        files += [os.path.relpath(os.path.join(root, n), REPO) for n in sorted(names) if n.endswith(".yaml")]
    missing, seen = [], 0
    for path in files:
        for number, line in enumerate(read(path).splitlines(), 1):
            # A command runs to the end of its code span or line.
            for command in re.findall(r"kubectl((?: +[^ `|;&)]+)+)", line):
                words = command.split()
                verbs = [w for i, w in enumerate(words)
                         if not w.startswith("-") and (i == 0 or words[i - 1] not in ("-n", "--namespace"))]
                options = " ".join(words)
                if not verbs or verbs[0] not in NAMESPACED_VERBS:
                    continue
                if verbs[0] == "get" and "node" in verbs[1:2]:
                    continue
                seen += 1
                if not re.search(r"(^| )(-n [a-z0-9-]+|--namespace[= ][a-z0-9-]+)( |$)", options):
                    missing.append(f"{path}:{number}: kubectl{command}")
    c.expect(seen >= 10 and not missing,
             f"every documented kubectl command on namespaced objects names its namespace ({seen} found)",
             "\n  ".join(missing))


# drt-server's own host memory besides the sessions' budget and the model's
# weights, allowed in each pod's memory request. Measured here (2026-11-24,
# build/server/drt-server, CPU backend, --threads 2, the bundled
# models/drt-text-byte): RSS 187 MiB idle; RSS minus drt_chunk_store_bytes
# 207 MiB with one 100K-token session and 194 MiB with 100K + 300K tokens in
# two, of which the model's fp32 weights are 11.5 MiB: about 200 MiB of
# runtime, thread stacks, window caches and step scratch. The allowance is
# five times that, for more threads (the overlays' 4), larger steps and gRPC
# receive buffers (up to 4 MiB per message per running Append).
SERVER_OVERHEAD_GIB = 1.0
# The CUDA runtime's and driver's own host memory (context, staging buffers):
# NOT measured (no GPU here); an allowance on top of the above.
CUDA_HOST_OVERHEAD_GIB = 2.0
# With the OpenAI API on, the JSON of the request bodies being parsed at
# once: up to about 33 times the bytes (review-deploy F2 measured 2 GB for a
# 64 MiB body of arrays nested 63 deep; 1.66 GB peak for three 16 MiB bodies
# nested 60 deep, measured here), bounded by
# --openai_max_inflight_request_bytes (drt-server's default when unset).
JSON_PARSE_FACTOR = 33
DEFAULT_OPENAI_INFLIGHT_BYTES = 128 << 20


def model_weight_bytes(model_dir):
    """The bytes of the model's weights as the CPU backend holds them (fp32),
    from model.safetensors' header: 4 bytes per parameter whatever the file
    stores."""
    with open(os.path.join(REPO, model_dir, "model.safetensors"), "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    params = 0
    for name, tensor in header.items():
        if name != "__metadata__":
            count = 1
            for d in tensor["shape"]:
                count *= d
            params += count
    return 4 * params


def quantity_gib(quantity):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Mi|Gi|Ti)", str(quantity))
    if not m:
        raise SystemExit(f"memory quantity {quantity!r}: expected <number>Mi|Gi|Ti")
    return float(m.group(1)) * {"Mi": 1 / 1024, "Gi": 1, "Ti": 1024}[m.group(2)]


def check_memory(c, name, container, facts, gpu):
    """Memory request = limit >= the session budget + the model + the
    overhead (review-deploy #6): a pod whose sessions fill the budget uses no
    more than it requested, so kubelet does not evict it first under node
    memory pressure, and the scheduler reserves a GPU pod's pinned budget on
    the node."""
    resources = container["resources"]
    limits, requests = resources.get("limits", {}), resources.get("requests", {})
    env = env_of(container)
    budget = float(env["DRT_HOST_MEMORY_BUDGET_GB"]["value"])
    model = env.get("DRT_MODEL", {}).get("value", facts["image_model"])
    baked = model == facts["image_model"]
    model_gib = facts["image_model_bytes"] / 2**30 if baked else 0.0
    overhead = SERVER_OVERHEAD_GIB + (CUDA_HOST_OVERHEAD_GIB if gpu else 0.0)
    parse_gib = 0.0
    if env.get("DRT_OPENAI_LISTEN", {}).get("value"):
        inflight = int(env.get("DRT_OPENAI_MAX_INFLIGHT_REQUEST_BYTES", {}).get(
            "value", DEFAULT_OPENAI_INFLIGHT_BYTES))
        largest = int(env.get("DRT_OPENAI_MAX_REQUEST_BYTES", {}).get("value", 64 << 20))
        c.expect(largest <= inflight,
                 f"{name}: DRT_OPENAI_MAX_REQUEST_BYTES {largest} <= DRT_OPENAI_MAX_INFLIGHT_REQUEST_BYTES "
                 f"{inflight} (drt-server refuses to start otherwise)")
        parse_gib = JSON_PARSE_FACTOR * inflight / 2**30
        overhead += parse_gib
    needed = budget + model_gib + overhead
    request, limit = quantity_gib(requests.get("memory", "0Gi")), quantity_gib(limits.get("memory", "0Gi"))
    c.expect(request == limit,
             f"{name}: memory request = limit ({requests.get('memory')} / {limits.get('memory')}): a full pod "
             "is never above its request")
    c.expect(request >= needed,
             f"{name}: memory request {request:g} GiB >= budget {budget:g} + model {model_gib:.2f} "
             f"({'the image' + chr(39) + 's ' + model if baked else model + ': not in the repository, not counted'})"
             f" + overhead {overhead:.2f} (of which {parse_gib:.2f} for the OpenAI request bodies parsed at once)"
             f" = {needed:.2f} GiB")


def check_gpu_rollout(c, name, deployment):
    """A GPU Deployment's rolling update must not need a spare GPU: a surge
    pod on a full GPU pool stays Pending and, with maxUnavailable 0, no old
    pod ever stops (review-deploy #2). Stop first, then start."""
    strategy = deployment["spec"].get("strategy", {})
    rolling = strategy.get("rollingUpdate", {})
    c.expect(strategy.get("type", "RollingUpdate") == "RollingUpdate" and rolling.get("maxSurge") in (0, "0%")
             and rolling.get("maxUnavailable") not in (None, 0, "0%"),
             f"{name}: a rolling update stops a GPU pod before starting its replacement (maxSurge 0, "
             "maxUnavailable >= 1): no spare GPU needed", str(strategy))


def check_image_pull(c, name, container):
    """The overlays name reusable tags (cpu, cuda) that each build pushes
    again. With IfNotPresent a node that has the old image cached runs it
    under the new manifests, and an image older than the engine health
    service fails the new liveness probe forever (review-deployfix #1). So
    the image is pulled on every start unless it is pinned by digest."""
    image = container["image"]
    policy = container.get("imagePullPolicy")
    c.expect(policy == "Always" or "@sha256:" in image,
             f"{name}: image {image} is a reusable tag, so imagePullPolicy is Always (a cached older image "
             "would run under these manifests)", str(policy))


def check_engine_liveness(c, name, container, facts):
    """Liveness asks the engine's own health service (it fails when work is
    queued and no engine step finishes: review-deploy #5); startup and
    readiness ask the drain status ("" / drt.v1.Drt), so a slow step does not
    take the pod and its keys out of the ring."""
    liveness = container["livenessProbe"].get("grpc", {}).get("service")
    c.expect(liveness == facts["engine_health_service"],
             f"{name}: the liveness probe asks grpc.health.v1 service {facts['engine_health_service']} "
             "(the engine watchdog, server/engine_watchdog.h)", str(container["livenessProbe"]))
    others = [container[p].get("grpc", {}).get("service", "") for p in ("startupProbe", "readinessProbe")]
    c.expect(all(s in ("", "drt.v1.Drt") for s in others),
             f"{name}: startup and readiness follow the drain, not the engine watchdog", str(others))
    env = env_of(container)
    stall = int(env.get("DRT_ENGINE_STALL_SECONDS", {}).get("value", facts["engine_stall_default"]))
    c.expect(stall > 0, f"{name}: the engine watchdog is on (--engine_stall_seconds {stall})")


def check_upstream_keepalive(c, name, cluster, facts):
    """The gateway pings each drt-server connection (HTTP/2 PING) and keeps
    TCP keepalive on it, so that a pod lost without a FIN does not leave
    streams hanging on a dead connection (review-deploy #3); drt-server must
    accept pings that often, or it cuts the connection with GOAWAY
    too_many_pings at the third."""
    seconds = lambda v: float(str(v).rstrip("s"))
    options = cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    keepalive = options.get("explicit_http_config", {}).get("http2_protocol_options", {}).get("connection_keepalive", {})
    allowed = facts["min_client_ping_ms"] / 1000
    c.expect("interval" in keepalive and "timeout" in keepalive and seconds(keepalive["interval"]) >= allowed,
             f"{name}: HTTP/2 keepalive pings to drt-server (interval {keepalive.get('interval')}, timeout "
             f"{keepalive.get('timeout')}) no more often than drt-server accepts ({allowed:g} s, "
             "kMinClientPingIntervalMs)", str(keepalive))
    tcp = cluster.get("upstream_connection_options", {}).get("tcp_keepalive", {})
    c.expect(all(k in tcp for k in ("keepalive_time", "keepalive_interval", "keepalive_probes")),
             f"{name}: TCP keepalive on upstream connections", str(tcp))


def joined_code_spans(text):
    """The markdown text with every inline code span that wraps onto the next
    line of its paragraph joined onto one line (fenced blocks as they are),
    so that a documented command can be read from one line. Backticks pair
    left to right within a paragraph, as markdown pairs them."""
    out, prose = [], []

    def flush():
        for paragraph in re.split(r"\n[ \t]*\n", "\n".join(prose)):
            out.append(re.sub(r"`[^`]*`", lambda m: re.sub(r"\s*\n\s*", " ", m.group(0)), paragraph))
        prose.clear()

    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if not fenced:
                flush()
            fenced = not fenced
            out.append(line)
        elif fenced:
            out.append(line)
        else:
            prose.append(line)
    flush()
    return "\n".join(out)


def check_release_label(c, monitors):
    """kube-prometheus-stack picks ServiceMonitors and PrometheusRules by its
    `release` label (serviceMonitorSelector, ruleSelector); the documented
    label command must name every one deploy/k8s/monitoring renders, or the
    alerts never load (review-deployfix #4)."""
    wanted = {(kind.lower(), name) for (kind, name) in monitors if kind in ("ServiceMonitor", "PrometheusRule")}
    labelled, commands = set(), 0
    for line in joined_code_spans(read("docs/deploy.md")).splitlines():
        for command in re.findall(r"kubectl((?: +[^ `|;&)]+)+)", line):
            words = command.split()
            if "label" not in words or not any(w.startswith("release=") for w in words):
                continue
            commands += 1
            start = words.index("label") + 1
            args = [w for i, w in enumerate(words[start:], start)
                    if not w.startswith("-") and words[i - 1] not in ("-n", "--namespace") and "=" not in w]
            if args and "/" not in args[0]:  # TYPE NAME...
                labelled |= {(args[0].lower(), n) for n in args[1:]}
            else:  # TYPE/NAME...
                labelled |= {tuple(a.lower().split("/", 1)) for a in args}
    c.expect(commands >= 1 and wanted <= labelled and len(wanted) >= 3,
             f"docs/deploy.md: the release label command names every ServiceMonitor and PrometheusRule of "
             f"deploy/k8s/monitoring ({len(wanted)})", f"not labelled: {sorted(wanted - labelled)}")


def check_alert_rules(c, monitors, facts):
    """The PrometheusRule's expressions name only metrics drt-server exports
    (a renamed metric would leave an alert that never fires), and alert on
    the budget as a ratio of the exported limit (review-deploy #9)."""
    rules = [r for (kind, _), o in monitors.items() if kind == "PrometheusRule"
             for g in o["spec"]["groups"] for r in g["rules"]]
    # Metric names outside label values ("..."); a histogram's series are
    # its name with _bucket, _sum or _count.
    named = {re.sub(r"_(bucket|sum|count)$", "", m) if re.sub(r"_(bucket|sum|count)$", "", m) in facts["metrics"]
             else m
             for r in rules for m in re.findall(r"\b(drt_\w+)", re.sub(r'"[^"]*"', '""', r["expr"]))}
    unknown = sorted(m for m in named if m not in facts["metrics"])
    c.expect(rules and not unknown, f"monitoring: {len(rules)} alert rules name only metrics drt-server exports",
             f"unknown: {unknown}")
    exprs = " ".join(r["expr"] for r in rules)
    # review-deploy F4/F9: a pod not Ready (a dead node leaves a StatefulSet
    # pod for a person to act on), a scrape target down, the durable claim
    # filling, the gateway's circuit breakers overflowing.
    wanted = {"DrtServerPodNotReady": "kube_pod_status_ready", "DrtScrapeTargetDown": "up{",
              "DrtStateClaimFilling": "kubelet_volume_stats_available_bytes",
              "DrtGatewayOverflow": "envoy_cluster_upstream_rq_pending_overflow"}
    by_name = {r.get("alert"): r["expr"] for r in rules}
    missing = [a for a, metric in wanted.items() if metric not in by_name.get(a, "")]
    c.expect(not missing, "monitoring: alerts on a pod not Ready, a target down, the claim filling and "
             "gateway overflows", f"missing: {missing}")
    # review-deployfix 6: an evicted or failed pod lingers, never Ready; the
    # alert counts only pods in phase Pending or Running.
    not_ready = by_name.get("DrtServerPodNotReady", "")
    c.expect(re.search(r'and on \(namespace, pod\).*kube_pod_status_phase\{phase=~"Pending\|Running"',
                       not_ready) is not None,
             "monitoring: DrtServerPodNotReady leaves out pods in phase Failed or Succeeded",
             not_ready)
    claim = re.search(r'persistentvolumeclaim=~"([^"]+)"', by_name.get("DrtStateClaimFilling", ""))
    c.expect(claim is not None and re.fullmatch(claim.group(1), "state-drt-server-0"),
             "monitoring: DrtStateClaimFilling matches the StatefulSet's claim names (state-drt-server-N)")
    c.expect("drt_chunk_store_bytes / drt_host_memory_budget_bytes" in exprs
             and 'drt_errors_total{code="RESOURCE_EXHAUSTED"}' in exprs,
             "monitoring: alerts on the budget ratio and on RESOURCE_EXHAUSTED refusals")
    # Every Envoy cluster that routes to drt-server pods, in every shipped
    # gateway config, is watched by the unhealthy-hosts alert (the OpenAI
    # API's drt_openai was not: review-deploy, "no alert on drt_openai").
    hosts = [r["expr"] for r in rules if r.get("alert") == "DrtGatewayHostsUnhealthy"]
    pod_clusters = set()
    for path in ("deploy/k8s/gateway/envoy.yaml", "deploy/k8s/examples/gateway-tls/envoy.yaml",
                 "deploy/k8s/examples/durable-statefulset/gateway/envoy.yaml"):
        pod_clusters |= {cl["name"] for cl in yaml.safe_load(read(path))["static_resources"]["clusters"]
                         if cl["name"] != "admin"}
    watched = set()
    for expr in hosts:
        for selector in re.findall(r'envoy_cluster_name=~?"([^"]*)"', expr):
            watched |= set(selector.split("|"))
    c.expect(len(hosts) == 1 and pod_clusters and pod_clusters <= watched
             and all(f"by (namespace, envoy_cluster_name)" in e for e in hosts),
             f"monitoring: DrtGatewayHostsUnhealthy watches every gateway cluster to the pods, one series each "
             f"({sorted(pod_clusters)})", f"not watched: {sorted(pod_clusters - watched)}; exprs {hosts}")


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_server(c, name, objects, facts, gpu):
    kinds = sorted(objects)
    c.expect(kinds == [("Deployment", "drt-server"), ("PodDisruptionBudget", "drt-server"),
                       ("Service", "drt-server"), ("Service", "drt-server-pods")],
             f"{name}: a Deployment, its PodDisruptionBudget and two Services", str(kinds))
    deployment = objects[("Deployment", "drt-server")]
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    c.expect(matches(deployment["spec"]["selector"]["matchLabels"], labels),
             f"{name}: the Deployment selects its own pods")
    spec = pod["spec"]
    (container,) = spec["containers"]
    env = env_of(container)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    c.expect(ports == {"grpc": 50051, "http": 9090, "openai": 8000} and set(ports.values()) == facts["exposed"],
             f"{name}: container ports grpc 50051, http 9090 and openai 8000, as the image EXPOSEs", str(ports))
    c.expect(set(facts["image_listen"].values()) <= facts["exposed"]
             and facts["image_listen"].get("DRT_OPENAI_LISTEN") == ports.get("openai"),
             f"{name}: the image's DRT_*LISTEN defaults are on ports it EXPOSEs, the OpenAI API's on the pod's "
             f"openai port", f"{facts['image_listen']}, EXPOSE {sorted(facts['exposed'])}")
    # Each listener on a wildcard address (else the pod's port answers
    # nothing from outside the pod) and the port the pod declares for it;
    # the OpenAI API is on in the base, since the gateway routes /v1/ to it.
    for variable, port_name in (("DRT_LISTEN", "grpc"), ("DRT_HTTP_LISTEN", "http"), ("DRT_OPENAI_LISTEN", "openai")):
        value = env.get(variable, {}).get("value")
        c.expect(value in (f"0.0.0.0:{ports.get(port_name)}", f"[::]:{ports.get(port_name)}"),
                 f"{name}: {variable} listens on every address at the pod's {port_name} port {ports.get(port_name)}",
                 str(value))
    unknown = [k for k in env if k.startswith("DRT_") and k[4:].lower() not in facts["flags"]]
    c.expect(not unknown, f"{name}: every DRT_* variable is a drt-server flag", str(unknown))

    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        grpc_probe = container.get(probe, {}).get("grpc", {})
        c.expect(grpc_probe.get("port") == ports["grpc"], f"{name}: {probe} is a grpc.health.v1 probe on 50051",
                 str(container.get(probe)))
    check_engine_liveness(c, name, container, facts)
    check_image_pull(c, name, container)
    startup = container["startupProbe"]
    c.expect(deployment["spec"].get("progressDeadlineSeconds", 600) > startup["periodSeconds"] * startup["failureThreshold"],
             f"{name}: progressDeadlineSeconds {deployment['spec'].get('progressDeadlineSeconds', 600)} > the startup "
             f"probe's {startup['periodSeconds'] * startup['failureThreshold']} s (a slow load is not a failed rollout)")
    c.expect(container["readinessProbe"].get("timeoutSeconds", 1) >= 5,
             f"{name}: readiness waits 5 s for an answer (no flapping under load)", str(container["readinessProbe"]))
    grace = int(env["DRT_SHUTDOWN_GRACE_SECONDS"]["value"])
    liveness = container["livenessProbe"]
    c.expect(liveness["periodSeconds"] * liveness["failureThreshold"] > grace,
             f"{name}: liveness cannot fail within a drain ({grace} s)")
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    pre_stop_seconds = int(pre_stop[-1]) if pre_stop[0].endswith("sleep") else 0
    needed = pre_stop_seconds + grace + facts["stop_slack"] + facts["slack"]
    c.expect(spec["terminationGracePeriodSeconds"] > needed,
             f"{name}: terminationGracePeriodSeconds {spec['terminationGracePeriodSeconds']} > preStop "
             f"{pre_stop_seconds} + drain {grace} + stop slack {facts['stop_slack']} + forced-exit slack "
             f"{facts['slack']} = {needed}")

    security = container["securityContext"]
    pod_security = spec["securityContext"]
    c.expect(security.get("readOnlyRootFilesystem") is True and security.get("allowPrivilegeEscalation") is False
             and security.get("capabilities", {}).get("drop") == ["ALL"],
             f"{name}: read-only root filesystem, no privilege escalation, no capabilities", str(security))
    c.expect(pod_security.get("runAsNonRoot") is True and pod_security.get("runAsUser") == facts["uid"],
             f"{name}: runs as non-root uid {facts['uid']}, the image's user", str(pod_security))
    token = env.get("DRT_BEARER_TOKEN", {}).get("valueFrom", {}).get("secretKeyRef", {})
    c.expect(token.get("name") and token.get("key") and not token.get("optional", False),
             f"{name}: the bearer token comes from a Secret (required)", str(token))
    # The Secret's key must exist, but its value may be empty: the server
    # refuses to start without a token only with --require_bearer_token.
    c.expect(env.get("DRT_REQUIRE_BEARER_TOKEN", {}).get("value") == "true",
             f"{name}: DRT_REQUIRE_BEARER_TOKEN=true (an empty Secret value stops the start)",
             str(env.get("DRT_REQUIRE_BEARER_TOKEN")))
    c.expect(spec.get("enableServiceLinks") is False, f"{name}: no service-link variables in the pod")

    resources = container["resources"]
    limits, requests = resources.get("limits", {}), resources.get("requests", {})
    c.expect("cpu" in requests and "memory" in requests and "memory" in limits,
             f"{name}: cpu and memory requests, a memory limit", str(resources))
    check_memory(c, name, container, facts, gpu)
    image = container["image"]
    if gpu:
        c.expect(limits.get("nvidia.com/gpu") == 1 and requests.get("nvidia.com/gpu") == 1,
                 f"{name}: one nvidia.com/gpu requested and limited", str(resources))
        c.expect(env["DRT_DEVICE"]["value"] == "cuda" and image.endswith(":cuda"),
                 f"{name}: the CUDA image on --device=cuda", f"{image} {env['DRT_DEVICE']}")
        c.expect(bool(spec.get("nodeSelector")), f"{name}: a GPU node selector", str(spec.get("nodeSelector")))
        check_gpu_rollout(c, name, deployment)
        c.expect(any(t.get("key") == "nvidia.com/gpu" and t.get("effect") == "NoSchedule"
                     for t in spec.get("tolerations", [])), f"{name}: tolerates the nvidia.com/gpu taint")
    else:
        c.expect("nvidia.com/gpu" not in limits and "nvidia.com/gpu" not in requests
                 and not spec.get("tolerations"), f"{name}: no GPU", str(resources))
        c.expect(env["DRT_DEVICE"]["value"] == "cpu" and image.endswith(":cpu"),
                 f"{name}: the CPU image on --device=cpu", f"{image} {env['DRT_DEVICE']}")

    for service_name in ("drt-server", "drt-server-pods"):
        service = objects[("Service", service_name)]
        c.expect(matches(service["spec"]["selector"], labels), f"{name}: Service {service_name} selects the pods")
        targets = [p["targetPort"] for p in service["spec"]["ports"]]
        c.expect(all(t in ports for t in targets), f"{name}: Service {service_name} targets named container ports",
                 str(targets))
    # The OpenAI API reachable through the ClusterIP Service (stateless: any
    # pod answers) and listed on the headless one the gateway resolves.
    for service_name in ("drt-server", "drt-server-pods"):
        service_ports = objects[("Service", service_name)]["spec"]["ports"]
        c.expect(any(p["targetPort"] == "openai" and p.get("appProtocol") == "http" for p in service_ports),
                 f"{name}: Service {service_name} has a port for the OpenAI API (targetPort openai, HTTP)",
                 str(service_ports))
    pdb = objects[("PodDisruptionBudget", "drt-server")]["spec"]
    c.expect(matches(pdb["selector"]["matchLabels"], labels) and pdb.get("maxUnavailable") == 1,
             f"{name}: voluntary disruptions stop one pod at a time", str(pdb))
    headless = objects[("Service", "drt-server-pods")]["spec"]
    c.expect(headless.get("clusterIP") == "None", f"{name}: drt-server-pods is headless (one record per pod)")
    annotations = pod["metadata"].get("annotations", {})
    c.expect(annotations.get("prometheus.io/scrape") == "true"
             and int(annotations.get("prometheus.io/port", 0)) == ports["http"]
             and annotations.get("prometheus.io/path") == "/metrics",
             f"{name}: Prometheus scrape annotations on the pods point at http /metrics", str(annotations))
    # On the pods only: with the Service annotated too, a Prometheus running
    # both the kubernetes-pods and kubernetes-service-endpoints jobs scrapes
    # every pod twice and sums over pods double (review-tools 2026-11-24 #23).
    scraped = [s for (kind, s), o in objects.items() if kind == "Service"
               and any(k.startswith("prometheus.io/") for k in o["metadata"].get("annotations", {}))]
    c.expect(not scraped, f"{name}: no Service carries prometheus.io annotations", str(scraped))
    return objects


def check_gateway(c, objects, server_objects, facts):
    (config_map,) = [o for (kind, _), o in objects.items() if kind == "ConfigMap"]
    envoy = yaml.safe_load(config_map["data"]["envoy.yaml"])
    deployment = objects[("Deployment", "drt-gateway")]
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    c.expect(any(v.get("configMap", {}).get("name") == config_map["metadata"]["name"] for v in volumes),
             "gateway: the Deployment mounts the (hash-suffixed) Envoy ConfigMap")
    listener = next(l for l in envoy["static_resources"]["listeners"] if l["name"] == "grpc")
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    # The catch-all route carries the gRPC calls (/v1/ before it is the
    # OpenAI API's: openai_gateway_checks.py).
    route = next(r["route"] for r in hcm["route_config"]["virtual_hosts"][0]["routes"]
                 if r.get("match", {}).get("prefix") == "/")
    hashed = [h["header"]["header_name"] for h in route.get("hash_policy", []) if "header" in h]
    c.expect(hashed == [facts["header"]], f"gateway: routes hash the clients' {facts['header']} header", str(hashed))
    c.expect(route.get("timeout") in ("0s", 0), "gateway: no route timeout on long streams")
    cluster = next(cl for cl in envoy["static_resources"]["clusters"] if cl["name"] == route["cluster"])
    c.expect(cluster["lb_policy"] in ("RING_HASH", "MAGLEV"), "gateway: consistent-hash load balancing",
             cluster["lb_policy"])
    address = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    headless = server_objects[("Service", "drt-server-pods")]
    c.expect(cluster["type"] == "STRICT_DNS" and address["address"] == headless["metadata"]["name"]
             and address["port_value"] == headless["spec"]["ports"][0]["port"],
             "gateway: resolves the headless Service's pods, on its gRPC port", str(address))
    options = cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    c.expect("http2_protocol_options" in options.get("explicit_http_config", {}), "gateway: HTTP/2 to drt-server")
    check_upstream_keepalive(c, "gateway", cluster, facts)
    c.expect(any("grpc_health_check" in h for h in cluster.get("health_checks", [])),
             "gateway: grpc.health.v1 checks drop draining pods")
    check_gateway_drain(c, objects, config_map, envoy, cluster, server_objects, facts)
    container_ports = {p["name"]: p["containerPort"]
                       for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    c.expect(container_ports.get("grpc") == listener["address"]["socket_address"]["port_value"],
             "gateway: the container port is Envoy's listener")
    service = objects[("Service", "drt-gateway")]
    gateway_pod = deployment["spec"]["template"]["metadata"].get("annotations", {})
    c.expect(gateway_pod.get("prometheus.io/scrape") == "true"
             and not any(k.startswith("prometheus.io/") for k in service["metadata"].get("annotations", {})),
             "gateway: Prometheus annotations on the pods only, not the Service (no double scrape)")
    c.expect(matches(service["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])
             and all(p["targetPort"] in container_ports for p in service["spec"]["ports"]),
             "gateway: its Service selects it and targets its ports")


def expand(value, env):
    """Kubernetes' $(VAR) substitution in command and args."""
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)]["value"] if m.group(1) in env else m.group(0), value)


def check_gateway_drain(c, objects, config_map, envoy, cluster, server_objects, facts):
    """A gateway pod's stop drains its client streams (drain.sh) for at least
    as long as a drt-server pod's own drain, and nothing cuts that short."""
    deployment = objects[("Deployment", "drt-gateway")]
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env = env_of(container)
    args = [expand(a, env) for a in container.get("args", [])]
    pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    config_volume = next(v["name"] for v in spec["volumes"]
                         if v.get("configMap", {}).get("name") == config_map["metadata"]["name"])
    # The hook runs /bin/bash in the Envoy container: the envoyproxy/envoy
    # images are built on Ubuntu and have it, the distroless ones
    # (envoyproxy/envoy:distroless-*, envoyproxy/envoy-distroless) have no
    # shell, and there the hook would fail at once and SIGTERM would cut
    # every stream (review-toolsfix #3).
    image = container["image"]
    c.expect(re.fullmatch(r"(docker\.io/)?envoyproxy/envoy:v[0-9][0-9.]*(-latest)?(@sha256:[0-9a-f]{64})?", image)
             is not None,
             "gateway: the image is a Ubuntu-based envoyproxy/envoy:vX tag (bash for drain.sh), "
             "not a distroless one", image)
    c.expect(pre_stop == ["/bin/bash", mounts[config_volume] + "/drain.sh"]
             and config_map["data"].get("drain.sh") == facts["drain_script"],
             "gateway: preStop runs drain.sh from the mounted ConfigMap, the repository's copy", str(pre_stop))
    drain_calls = re.findall(r"admin POST '?(/[a-z_/]+\??[a-z]*)", facts["drain_script"])
    c.expect(drain_calls == ["/healthcheck/fail", "/drain_listeners?graceful"],
             "gateway: drain.sh fails health checks and drains listeners gracefully", str(drain_calls))
    admin_port = envoy["admin"]["address"]["socket_address"]["port_value"]
    c.expect(int(env.get("ENVOY_ADMIN_PORT", {}).get("value", -1)) == admin_port,
             f"gateway: drain.sh talks to envoy.yaml's admin port {admin_port}", str(env.get("ENVOY_ADMIN_PORT")))

    def arg(flag):
        return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None

    c.expect("GATEWAY_DRAIN_DELAY_SECONDS" in env and "GATEWAY_DRAIN_SECONDS" in env,
             "gateway: the drain delay and time are set (GATEWAY_DRAIN_DELAY_SECONDS, GATEWAY_DRAIN_SECONDS)")
    if "GATEWAY_DRAIN_DELAY_SECONDS" not in env or "GATEWAY_DRAIN_SECONDS" not in env:
        return
    delay = int(env["GATEWAY_DRAIN_DELAY_SECONDS"]["value"])
    drain = int(env["GATEWAY_DRAIN_SECONDS"]["value"])
    c.expect(arg("--drain-time-s") == str(drain) and arg("--drain-strategy") == "immediate",
             f"gateway: Envoy runs with --drain-time-s {drain} (GATEWAY_DRAIN_SECONDS) and "
             "--drain-strategy immediate", str(args))
    server_env = env_of(server_objects[("Deployment", "drt-server")]["spec"]["template"]["spec"]["containers"][0])
    server_grace = int(server_env["DRT_SHUTDOWN_GRACE_SECONDS"]["value"])
    c.expect(drain >= server_grace,
             f"gateway: streams get {drain} s on a gateway stop, no less than drt-server's drain ({server_grace} s)")
    hook_bound = delay + drain + facts["drain_bound"]
    c.expect(spec["terminationGracePeriodSeconds"] > hook_bound,
             f"gateway: terminationGracePeriodSeconds {spec['terminationGracePeriodSeconds']} > drain.sh's bound "
             f"{delay} + {drain} + {facts['drain_bound']} = {hook_bound}")
    liveness = container["livenessProbe"]
    c.expect(liveness["periodSeconds"] * liveness["failureThreshold"] > hook_bound,
             f"gateway: liveness (/ready answers 503 while draining) cannot fail within the preStop hook "
             f"({hook_bound} s)")
    spread = spec.get("topologySpreadConstraints", [])
    c.expect(any(t.get("topologyKey") == "kubernetes.io/hostname"
                 and matches(t.get("labelSelector", {}).get("matchLabels"), deployment["spec"]["template"]["metadata"]["labels"])
                 for t in spread),
             "gateway: its replicas spread over nodes (one node's loss does not take both)", str(spread))
    rolling = deployment["spec"].get("strategy", {}).get("rollingUpdate", {})
    c.expect(rolling.get("maxUnavailable") == 0 and rolling.get("maxSurge", 0) >= 1,
             "gateway: a rolling update starts a new pod before draining an old one", str(rolling))
    pdb = objects.get(("PodDisruptionBudget", "drt-gateway"), {}).get("spec", {})
    c.expect(matches(pdb.get("selector", {}).get("matchLabels"), deployment["spec"]["template"]["metadata"]["labels"])
             and pdb.get("maxUnavailable") == 1 and deployment["spec"]["replicas"] >= 2,
             "gateway: voluntary disruptions stop one of its replicas at a time", str(pdb))

    # Health checks: one lost check must not move keys (their sessions' next
    # calls would get NOT_FOUND elsewhere), yet a draining pod must be out of
    # the ring before its drain ends.
    (check,) = cluster["health_checks"]
    seconds = lambda v: float(str(v).rstrip("s"))
    out_after = seconds(check["interval"]) * check["unhealthy_threshold"] + seconds(check["timeout"])
    c.expect(check["unhealthy_threshold"] >= 2,
             f"gateway: a pod leaves the ring after {check['unhealthy_threshold']} failed checks in a row (>= 2)")
    c.expect(out_after < server_grace,
             f"gateway: a draining pod is out of the ring within interval x threshold + timeout = {out_after:g} s, "
             f"inside drt-server's drain ({server_grace} s)")


def check_durable(c, objects, gateway, cpu, facts):
    """examples/durable-statefulset: drt-server as a StatefulSet whose pods
    each own a claim with the state directory, and its gateway, which keeps
    keys on pod names through restarts."""
    name = "examples/durable-statefulset"
    kinds = sorted(objects)
    sts = objects.get(("StatefulSet", "drt-server"), {"metadata": {"name": "drt-server"}, "spec": {"replicas": 0}})
    spec = sts["spec"]
    per_pod = [f"{sts['metadata']['name']}-{i}" for i in range(spec["replicas"])]
    c.expect(kinds == sorted([("PodDisruptionBudget", "drt-server"), ("Service", "drt-server"),
                              ("Service", "drt-server-pods"), ("StatefulSet", "drt-server")]
                             + [("Service", s) for s in per_pod]),
             f"{name}: the StatefulSet replaces the Deployment (no Deployment left), with one Service "
             f"per replica ({len(per_pod)})", str(kinds))
    pod = spec["template"]
    labels = pod["metadata"]["labels"]
    c.expect(matches(spec["selector"]["matchLabels"], labels), f"{name}: the StatefulSet selects its own pods")
    (container,) = pod["spec"]["containers"]
    env = env_of(container)
    check_memory(c, name, container, facts, gpu=False)
    check_image_pull(c, name, container)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    templates = {t["metadata"]["name"]: t["spec"] for t in spec.get("volumeClaimTemplates", [])}
    pod_volumes = {v["name"] for v in pod["spec"].get("volumes", [])}

    # The state directory is on the pod's own claim.
    state_dir = env.get("DRT_STATE_DIR", {}).get("value", "")
    c.expect("state_dir" in facts["flags"] and state_dir.startswith("/"),
             f"{name}: DRT_STATE_DIR (drt-server's --state_dir) is an absolute path", state_dir)
    on_claim = [v for v, path in mounts.items() if v in templates and v not in pod_volumes
                and os.path.dirname(state_dir.rstrip("/")) == path.rstrip("/")]
    c.expect(len(on_claim) == 1,
             f"{name}: --state_dir {state_dir} is a directory directly inside the mount of a "
             "volumeClaimTemplate (drt-server creates it; its parent must exist)",
             f"mounts {mounts}, claim templates {sorted(templates)}")
    claim = templates[on_claim[0]] if on_claim else {}
    c.expect(claim.get("accessModes") == ["ReadWriteOnce"],
             f"{name}: the state claim is ReadWriteOnce (one node, one server per claim)", str(claim))
    c.expect(not container.get("volumeMounts") or all(not m.get("readOnly") for m in container["volumeMounts"]
                                                      if m["name"] in on_claim),
             f"{name}: the state volume is mounted writable")
    security = pod["spec"]["securityContext"]
    c.expect(security.get("fsGroup") == facts["uid"] and security.get("fsGroupChangePolicy") == "OnRootMismatch",
             f"{name}: the volume is writable by the image's user (fsGroup {facts['uid']}), without a "
             "recursive chown at every start (OnRootMismatch)", str(security))

    # One pod at a time per claim: stop, then start. A StatefulSet has no
    # surge (it never runs two pods of one ordinal); what can be got wrong is
    # OnDelete (no updates) or a partition that holds pods back.
    strategy = spec.get("updateStrategy", {})
    c.expect(strategy.get("type", "RollingUpdate") == "RollingUpdate"
             and strategy.get("rollingUpdate", {}).get("partition", 0) == 0,
             f"{name}: updates replace every pod, one at a time (RollingUpdate, no partition)", str(strategy))
    headless = objects[("Service", spec.get("serviceName", ""))] if ("Service", spec.get("serviceName", "")) in objects else {}
    hspec = headless.get("spec", {})
    c.expect(hspec.get("clusterIP") == "None" and matches(hspec.get("selector"), labels)
             and hspec.get("publishNotReadyAddresses") is True,
             f"{name}: serviceName is a headless Service of its pods that publishes pods not yet ready "
             "(a restarting pod keeps its DNS name)", str(hspec))

    # Each pod has a ClusterIP Service of its own, whose name resolves
    # whether or not the pod exists: the gateway's hosts (below).
    for i, service_name in enumerate(per_pod):
        service = objects.get(("Service", service_name), {}).get("spec", {})
        selector = service.get("selector", {})
        ports = service.get("ports", [])
        c.expect(service.get("type", "ClusterIP") == "ClusterIP" and service.get("clusterIP") != "None"
                 and selector.get("statefulset.kubernetes.io/pod-name") == service_name
                 and matches(selector, {**labels, "statefulset.kubernetes.io/pod-name": service_name})
                 and len(ports) == 1 and ports[0].get("port") == hspec.get("ports", [{}])[0].get("port")
                 and ports[0].get("targetPort") == hspec.get("ports", [{}])[0].get("targetPort")
                 and service.get("publishNotReadyAddresses") is True,
                 f"{name}: Service {service_name} is a ClusterIP (a virtual IP, not a headless record) "
                 f"selecting pod {i} alone by its pod-name label, on the gRPC port, not-ready pods included",
                 str(service))

    # Stop and start times.
    grace = int(env["DRT_SHUTDOWN_GRACE_SECONDS"]["value"])
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    pre_stop_seconds = int(pre_stop[-1]) if pre_stop[0].endswith("sleep") else 0
    needed = pre_stop_seconds + grace + facts["stop_slack"] + facts["slack"]
    period = pod["spec"]["terminationGracePeriodSeconds"]
    c.expect(period > needed, f"{name}: terminationGracePeriodSeconds {period} > preStop {pre_stop_seconds} + "
             f"drain {grace} + stop slack {facts['stop_slack']} + forced-exit slack {facts['slack']} = {needed}")
    # Startup and liveness are GET /livez on the HTTP port, which drt-server
    # serves before the --state_dir restore (200 while it moves on), so a
    # restore of any length is not cut off (review-deploy F5); a gRPC probe
    # would fail until the restore ended. Startup covers what comes before
    # the HTTP endpoint, the model load, as long as the Deployment's does.
    cpu_container = cpu[("Deployment", "drt-server")]["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("startupProbe", "livenessProbe"):
        handler = container[probe]
        get = handler.get("httpGet", {})
        c.expect("grpc" not in handler and get.get("path") == "/livez" and "/livez" in facts["http_paths"]
                 and get.get("port") in ports and ports[get["port"]] == ports.get("http"),
                 f"{name}: {probe} is GET /livez on the HTTP port (answered during the restore)", str(handler))
    startup, cpu_startup = container["startupProbe"], cpu_container["startupProbe"]
    allowed = startup["periodSeconds"] * startup["failureThreshold"]
    c.expect(allowed >= cpu_startup["periodSeconds"] * cpu_startup["failureThreshold"],
             f"{name}: the startup probe allows {allowed} s, at least the Deployment's model load "
             f"({cpu_startup['periodSeconds'] * cpu_startup['failureThreshold']} s)")
    liveness, cpu_liveness = container["livenessProbe"], cpu_container["livenessProbe"]
    c.expect(all(liveness.get(k) == cpu_liveness.get(k) for k in ("periodSeconds", "timeoutSeconds",
                                                                  "failureThreshold"))
             and liveness["periodSeconds"] * liveness["failureThreshold"] > grace,
             f"{name}: liveness has the Deployment's timing and cannot fail within a drain ({grace} s)",
             str(liveness))

    # Otherwise the cpu overlay's pod: what this example changes is listed here.
    mine = yaml.safe_load(yaml.safe_dump(pod))
    theirs = yaml.safe_load(yaml.safe_dump(cpu[("Deployment", "drt-server")]["spec"]["template"]))
    (mc,), (tc,) = mine["spec"]["containers"], theirs["spec"]["containers"]
    mc["env"] = sorted((e for e in mc["env"] if e["name"] != "DRT_STATE_DIR"), key=lambda e: e["name"])
    tc["env"] = sorted(tc["env"], key=lambda e: e["name"])
    mc["volumeMounts"] = [m for m in mc["volumeMounts"] if m["name"] not in on_claim]
    for probe in ("startupProbe", "livenessProbe"):  # checked above
        mc.pop(probe)
        tc.pop(probe)
    mine["spec"]["securityContext"].pop("fsGroupChangePolicy", None)
    c.expect(mine == theirs, f"{name}: otherwise the pod is the cpu overlay's (image, probes, resources, "
             "security, token)", f"\n  mine:   {mine}\n  theirs: {theirs}")

    # The gateway hashes keys onto the pods' names, and health does not move them.
    (config_map,) = [o for (kind, _), o in gateway.items() if kind == "ConfigMap"]
    envoy = yaml.safe_load(config_map["data"]["envoy.yaml"])
    base_envoy = yaml.safe_load(read("deploy/k8s/gateway/envoy.yaml"))
    cluster = next(cl for cl in envoy["static_resources"]["clusters"] if cl["name"] == "drt_server")
    hosts = [e["endpoint"]["address"]["socket_address"]
             for group in cluster["load_assignment"]["endpoints"] for e in group["lb_endpoints"]]
    grpc_port = hspec.get("ports", [{}])[0].get("port")
    c.expect([h["address"] for h in hosts] == per_pod and all(h["port_value"] == grpc_port for h in hosts),
             f"{name}/gateway: one host per StatefulSet pod, the name of its own Service, on the gRPC port "
             f"({len(per_pod)} replicas)", str(hosts))
    c.expect(cluster["type"] == "STRICT_DNS" and cluster["lb_policy"] == "RING_HASH"
             and cluster.get("common_lb_config", {}).get("consistent_hashing_lb_config", {})
             .get("use_hostname_for_hashing") is True,
             f"{name}/gateway: the ring hashes pod names, not addresses (a restarted pod keeps its keys)",
             str(cluster.get("common_lb_config")))
    check_upstream_keepalive(c, f"{name}/gateway", cluster, facts)
    gateway_checks.check_circuit_breakers(c, f"{name}/gateway", cluster, container, facts["max_sessions"],
                                          spec["replicas"], "the StatefulSet's replicas")
    c.expect(not cluster.get("health_checks") and not cluster.get("outlier_detection"),
             f"{name}/gateway: no health checks or outlier detection take a pod (and its keys) out of the ring")
    openai_gateway_checks.check_openai_gateway(c, f"{name}/gateway", envoy, container, spec.get("serviceName", ""),
                                               facts["max_sessions"], spec["replicas"], "the StatefulSet's replicas",
                                               facts)
    strip = lambda e: [cl for cl in e["static_resources"]["clusters"] if cl["name"] != "drt_server"]
    same = (strip(envoy) == strip(base_envoy) and envoy["static_resources"]["listeners"]
            == base_envoy["static_resources"]["listeners"] and envoy["admin"] == base_envoy["admin"]
            and envoy.get("overload_manager") == base_envoy.get("overload_manager"))
    c.expect(same, f"{name}/gateway: otherwise deploy/k8s/gateway's Envoy (listeners with the "
             f"{facts['header']} hash policy, admin, overload manager, drain)")
    deployment = gateway[("Deployment", "drt-gateway")]
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    c.expect(any(v.get("configMap", {}).get("name") == config_map["metadata"]["name"] for v in volumes)
             and config_map["data"].get("drain.sh") == facts["drain_script"],
             f"{name}/gateway: the gateway mounts this envoy.yaml, with the repository's drain.sh")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kubectl", action="append",
                   help="the kubectl to render with; repeat it to check each in turn (default $KUBECTL or "
                        "kubectl). Debian 12's own, without installing it: apt-get download kubernetes-client "
                        "&& dpkg-deb -x kubernetes-client_*.deb x, then --kubectl x/usr/bin/kubectl")
    args = p.parse_args()
    names = args.kubectl or [os.environ.get("KUBECTL", "kubectl")]
    kubectls = [shutil.which(n) for n in names]
    missing = [n for n, k in zip(names, kubectls) if not k]
    if missing and not args.kubectl:
        print(f"SKIPPED: no {missing[0]} (bash scripts/install_deps.sh installs one)")
        return 77
    if missing:
        print(f"no such kubectl: {', '.join(missing)}", file=sys.stderr)
        return 2
    versions = [client_version(k) for k in kubectls]
    if not args.kubectl and not any(is_debian_kubectl(v) for v in versions):
        debian = os.environ.get("KUBECTL_DEBIAN") or DEBIAN_KUBECTL
        if os.access(debian, os.X_OK):
            kubectls.append(debian)
            versions.append(client_version(debian))
        elif os.environ.get("KUBECTL_DEBIAN"):
            print(f"KUBECTL_DEBIAN={debian}: no such executable", file=sys.stderr)
            return 2
        else:
            print(f"NOT CHECKED: rendering with Debian 12's kubectl 1.20 (Kustomize 2.0.3): none at {debian} "
                  f"({DEBIAN_KUBECTL_HOWTO}); only the static $patch: scan guards it here")
    facts = source_facts()
    c = Checks()
    check_no_delete_patches(c)
    check_namespaced_commands(c)
    for kubectl, version in zip(kubectls, versions):
        print(f"using {kubectl}: {version}")
        check_all(c, kubectl, facts)
    return c.summary()


def client_version(kubectl):
    out = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True, timeout=60).stdout
    return " ".join(out.split())


def is_debian_kubectl(version):
    """Debian 12's kubernetes-client is 1.20 (1.20.5+really1.20.2)."""
    return re.search(r"v1\.20\.", version) is not None


def check_hpa_owns_replicas(c, hpa, overlays):
    """The HPA sets spec.replicas of the workload it targets; an overlay that
    names replicas sets it back on every `kubectl apply` (client-side apply
    patches a field the manifest names to the manifest's value): an HPA at
    10 pods and an overlay's `replicas: 1` stop nine pods and their sessions
    at once (review-deploy #1; Kubernetes, "Migrating Deployments and
    StatefulSets to horizontal autoscaling")."""
    target = hpa["spec"]["scaleTargetRef"]
    for name, objects in overlays.items():
        workload = objects.get((target["kind"], target["name"]))
        if workload is None:
            continue
        c.expect("replicas" not in workload["spec"],
                 f"{name}: no spec.replicas on {target['kind']} {target['name']}, which the HPA scales",
                 f"replicas: {workload['spec'].get('replicas')}")


def check_network_policy(c, kubectl, cpu, gateway):
    """examples/network-policy (review-deploy F10) selects the server pods
    and lets in the gateway's pods on every port the gateway's clusters and
    health checks use, and Prometheus on the metrics port."""
    policy = render(kubectl, "examples/network-policy")[("NetworkPolicy", "drt-server-ingress")]
    server_pod = cpu[("Deployment", "drt-server")]["spec"]["template"]["metadata"]["labels"]
    gateway_pod = gateway[("Deployment", "drt-gateway")]["spec"]["template"]["metadata"]["labels"]
    c.expect(matches(policy["spec"]["podSelector"]["matchLabels"], server_pod),
             "examples/network-policy: selects drt-server's pods", str(policy["spec"]["podSelector"]))
    (container,) = cpu[("Deployment", "drt-server")]["spec"]["template"]["spec"]["containers"]
    server_ports = {p["containerPort"] for p in container["ports"]}
    from_gateway = [r for r in policy["spec"]["ingress"]
                    if any(matches(f.get("podSelector", {}).get("matchLabels", {"-": "-"}), gateway_pod)
                           for f in r["from"])]
    ports = {p["port"] for r in from_gateway for p in r["ports"]}
    c.expect(ports == server_ports, f"examples/network-policy: the gateway's pods reach every server port "
             f"{sorted(server_ports)}", str(sorted(ports)))


def check_all(c, kubectl, facts):
    rendered = {name: render(kubectl, directory) for name, directory in
                (("cpu", "overlays/cpu"), ("gpu", "overlays/gpu"), ("examples/model-pvc", "examples/model-pvc"),
                 ("examples/http-probes", "examples/http-probes"))}
    cpu = check_server(c, "cpu", rendered["cpu"], facts, gpu=False)
    check_server(c, "gpu", rendered["gpu"], facts, gpu=True)
    gateway = render(kubectl, "gateway")
    check_gateway(c, gateway, cpu, facts)
    gateway_checks.check_plaintext_internal(c, gateway, read("deploy/k8s/gateway/service.yaml"))
    tls = (render(kubectl, "examples/gateway-tls") if os.path.isdir(os.path.join(K8S, "examples/gateway-tls"))
           else None)
    gateway_checks.check_tls(c, tls, gateway, read("docs/deploy.md"))
    openai_gateway_checks.check_openai_docs(c, read("docs/deploy.md"), gateway, tls)

    monitors = render(kubectl, "monitoring")
    service_ports = {p["name"] for p in cpu[("Service", "drt-server")]["spec"]["ports"]}
    monitor = monitors[("ServiceMonitor", "drt-server")]
    c.expect(matches(monitor["spec"]["selector"]["matchLabels"], cpu[("Service", "drt-server")]["metadata"]["labels"])
             and all(e["port"] in service_ports for e in monitor["spec"]["endpoints"]),
             "monitoring: the ServiceMonitor selects drt-server's Service and a port it has")

    check_alert_rules(c, monitors, facts)
    check_release_label(c, monitors)
    check_network_policy(c, kubectl, cpu, gateway)

    hpa = render(kubectl, "autoscaling")[("HorizontalPodAutoscaler", "drt-server")]
    target = hpa["spec"]["scaleTargetRef"]
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    c.expect(target["kind"] == "Deployment" and ("Deployment", target["name"]) in cpu,
             "autoscaling: the HPA scales the drt-server Deployment")
    c.expect(metric in facts["metrics"], f"autoscaling: {metric} is a metric drt-server exports",
             str(sorted(facts["metrics"])))
    check_hpa_owns_replicas(c, hpa, rendered)
    # One gateway may carry every stream of every pod the HPA can run,
    # surge pods of a rolling update included.
    cluster = next(cl for cl in gateway_checks.envoy_of(gateway)[1]["static_resources"]["clusters"]
                   if cl["name"] == "drt_server")
    most = hpa["spec"]["maxReplicas"]
    for overlay in ("cpu", "gpu"):
        deployment = rendered[overlay][("Deployment", "drt-server")]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        pods = most + gateway_checks.surge_pods(deployment, most)
        gateway_checks.check_circuit_breakers(
            c, f"gateway ({overlay})", cluster, container, facts["max_sessions"], pods,
            f"the HPA's maxReplicas {most} + the {overlay} overlay's surge {pods - most}")
        gateway_checks.check_concurrency(c, f"gateway ({overlay})", gateway[("Deployment", "drt-gateway")],
                                         cluster, pods)
        openai_gateway_checks.check_openai_gateway(
            c, f"gateway ({overlay})", gateway_checks.envoy_of(gateway)[1], container,
            rendered[overlay][("Service", "drt-server-pods")]["metadata"]["name"], facts["max_sessions"], pods,
            f"the HPA's maxReplicas {most} + the {overlay} overlay's surge {pods - most}", facts)
    gateway_checks.check_envoy_image(c, "gateway", gateway[("Deployment", "drt-gateway")])
    gateway_checks.check_internal_addresses(c, "gateway", gateway_checks.envoy_of(gateway)[1])
    gateway_checks.check_overload(c, "gateway", gateway_checks.envoy_of(gateway)[1],
                                  gateway[("Deployment", "drt-gateway")], cluster)

    pvc = rendered["examples/model-pvc"]
    pod = pvc[("Deployment", "drt-server")]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
              if "persistentVolumeClaim" in v}
    c.expect(("PersistentVolumeClaim", "drt-model") in pvc and claims == {"model": "drt-model"}
             and mounts.get("model") == env_of(container)["DRT_MODEL"]["value"],
             "examples/model-pvc: DRT_MODEL is the mounted claim", f"{mounts} {claims}")
    c.expect(pod.get("nodeSelector") and "nvidia.com/gpu" in container["resources"]["limits"],
             "examples/model-pvc: still the gpu overlay")
    check_memory(c, "examples/model-pvc", container, facts, gpu=True)
    check_image_pull(c, "examples/model-pvc", container)
    check_gpu_rollout(c, "examples/model-pvc", pvc[("Deployment", "drt-server")])

    http = rendered["examples/http-probes"][("Deployment", "drt-server")]
    (container,) = http["spec"]["template"]["spec"]["containers"]
    check_memory(c, "examples/http-probes", container, facts, gpu=False)
    check_image_pull(c, "examples/http-probes", container)
    ports = {p["name"] for p in container["ports"]}
    for probe, path in (("startupProbe", "/healthz"), ("readinessProbe", "/healthz"), ("livenessProbe", "/livez")):
        handler = container[probe]
        get = handler.get("httpGet", {})
        c.expect("grpc" not in handler and get.get("port") in ports and get.get("path") == path
                 and path in facts["http_paths"],
                 f"examples/http-probes: {probe} is GET {path} on a named port, with no grpc handler left",
                 str(handler))
    grace = int(env_of(container)["DRT_SHUTDOWN_GRACE_SECONDS"]["value"])
    liveness = container["livenessProbe"]
    c.expect(liveness["periodSeconds"] * liveness["failureThreshold"] > grace,
             "examples/http-probes: liveness cannot fail within a drain")

    check_durable(c, render(kubectl, "examples/durable-statefulset"),
                  render(kubectl, "examples/durable-statefulset/gateway"), cpu, facts)


if __name__ == "__main__":
    sys.exit(main())
