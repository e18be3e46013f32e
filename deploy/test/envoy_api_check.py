#!/usr/bin/env python3
"""Parses the gateway's Envoy configs against Envoy's v3 API protos.

Envoy itself is not needed (none runs here): each envoy.yaml under deploy/k8s
is read as an envoy.config.bootstrap.v3.Bootstrap, and each file-based SDS
file (a top-level `resources:` list) as its typed resources, with protobuf's
JSON parser, which refuses an unknown field, a misspelt enum value or a
`@type` the protos do not define. Every field or enum value the configs set
that the protos mark deprecated is listed. What it cannot see: Envoy's own
validation rules (protoc-gen-validate constraints), and behaviour.

The protos are not in this repository. Give the roots of three checkouts, at
the commits matching the Envoy release the gateway runs:
  envoyproxy/data-plane-api (envoy/...), cncf/xds (udpa/..., xds/...),
  bufbuild/protoc-gen-validate (validate/...)
and have `protoc` (Debian: protobuf-compiler) or grpcio-tools installed:

    envoy_api_check.py --api ~/data-plane-api --api ~/xds --api ~/protoc-gen-validate

Exits 0 when every file parses, 1 when one does not, 77 (ctest: skipped)
without --api or protoc.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BOOTSTRAP = "envoy.config.bootstrap.v3.Bootstrap"


def proto_index(roots):
    """{message full name: proto file path relative to its root} for every
    .proto under the roots."""
    names = {}
    for root in roots:
        for path in glob.glob(os.path.join(root, "**", "*.proto"), recursive=True):
            rel = os.path.relpath(path, root)
            text = open(path, encoding="utf-8").read()
            package = re.search(r"^package ([\w.]+);", text, re.M)
            for message in re.findall(r"^message (\w+) \{", text, re.M):
                names[f"{package.group(1)}.{message}" if package else message] = rel
    return names


def type_urls(value):
    """Every `@type` in a parsed YAML document."""
    if isinstance(value, dict):
        found = [value["@type"]] if isinstance(value.get("@type"), str) else []
        return found + [t for v in value.values() for t in type_urls(v)]
    if isinstance(value, list):
        return [t for v in value for t in type_urls(v)]
    return []


def protoc_command():
    if shutil.which("protoc"):
        return ["protoc"], []
    try:
        import grpc_tools
    except ImportError:
        return None, []
    return [sys.executable, "-m", "grpc_tools.protoc"], [os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")]


def descriptor_pool(roots, files, names):
    """A pool with the given message types and everything they import."""
    from google.protobuf import descriptor_pb2, descriptor_pool as pool_module
    command, extra = protoc_command()
    wanted = sorted({names[n] for n in files})
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "api.pb")
        includes = [f"-I{r}" for r in roots] + [f"-I{e}" for e in extra]
        run = subprocess.run(command + includes + ["--include_imports", f"--descriptor_set_out={out}"] + wanted,
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(f"protoc failed:\n{run.stderr[-2000:]}")
        fds = descriptor_pb2.FileDescriptorSet.FromString(open(out, "rb").read())
    pool = pool_module.DescriptorPool()
    for f in fds.file:
        pool.Add(f)
    return pool


def message_class(pool, name):
    from google.protobuf import message_factory
    descriptor = pool.FindMessageTypeByName(name)
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(pool).GetPrototype(descriptor)


def deprecated_uses(pool, message, path, out):
    """Appends `path.field` for every set field or enum value the protos
    mark deprecated, looking inside Any."""
    for field, value in message.ListFields():
        here = f"{path}.{field.name}"
        if field.GetOptions().deprecated:
            out.append(here)
        repeated = field.label == field.LABEL_REPEATED
        if field.type == field.TYPE_ENUM:
            for v in (value if repeated else [value]):
                enum_value = field.enum_type.values_by_number.get(v)
                if enum_value is not None and enum_value.GetOptions().deprecated:
                    out.append(f"{here}={enum_value.name}")
        elif field.type == field.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                items = [(f"{here}[{k}]", value[k]) for k in value]
                items = [(p, v) for p, v in items if hasattr(v, "ListFields")]
            else:
                items = [(f"{here}[{i}]", v) for i, v in enumerate(value)] if repeated else [(here, value)]
            for p, v in items:
                if v.DESCRIPTOR.full_name == "google.protobuf.Any":
                    name = v.type_url.split("/")[-1]
                    inner = message_class(pool, name)()
                    inner.ParseFromString(v.value)
                    deprecated_uses(pool, inner, f"{p}<{name.rsplit('.', 1)[-1]}>", out)
                else:
                    deprecated_uses(pool, v, p, out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--api", action="append", default=[], help="a proto root (repeat: data-plane-api, xds, "
                                                               "protoc-gen-validate)")
    p.add_argument("files", nargs="*", help="configs to check (default: deploy/k8s/**/envoy.yaml and the SDS "
                                            "files beside them)")
    args = p.parse_args()
    if not args.api:
        print("SKIPPED: no --api proto roots given (see --help)")
        return 77
    if protoc_command()[0] is None:
        print("SKIPPED: neither protoc nor grpcio-tools is installed")
        return 77
    files = args.files or sorted(glob.glob(os.path.join(REPO, "deploy", "k8s", "**", "*.yaml"), recursive=True))
    documents = {}
    for path in files:
        loaded = [d for d in yaml.safe_load_all(open(path)) if d is not None]
        data = loaded[0] if len(loaded) == 1 else None
        if isinstance(data, dict) and set(data) == {"resources"} and type_urls(data):
            documents[path] = ("resources", data)
        elif args.files or os.path.basename(path) == "envoy.yaml":
            documents[path] = ("bootstrap", data)  # named on the command line: an Envoy config
    if not documents:
        print("FAILED: no Envoy config found")
        return 1
    names = proto_index(args.api)
    wanted = {BOOTSTRAP} | {t.split("/")[-1] for _, d in documents.values() for t in type_urls(d)}
    unknown = sorted(n for n in wanted if n not in names)
    if unknown:
        print(f"FAILED: no proto defines {', '.join(unknown)} under {args.api}")
        return 1
    pool = descriptor_pool(args.api, wanted, names)

    from google.protobuf import any_pb2, json_format
    failed = 0
    for path, (kind, data) in documents.items():
        shown = os.path.relpath(path, REPO)
        uses = []
        try:
            if kind == "bootstrap":
                message = message_class(pool, BOOTSTRAP)()
                json_format.ParseDict(data, message, descriptor_pool=pool)
                deprecated_uses(pool, message, "bootstrap", uses)
            else:
                for i, resource in enumerate(data["resources"]):
                    wrapped = any_pb2.Any()
                    json_format.ParseDict(resource, wrapped, descriptor_pool=pool)
                    inner = message_class(pool, wrapped.type_url.split("/")[-1])()
                    inner.ParseFromString(wrapped.value)
                    deprecated_uses(pool, inner, f"resources[{i}]", uses)
        except json_format.ParseError as e:
            failed += 1
            print(f"FAILED: {shown}: {str(e)[:600]}")
            continue
        print(f"ok: {shown} parses as {BOOTSTRAP if kind == 'bootstrap' else 'its typed resources'}"
              + (f"; deprecated: {', '.join(uses)}" if uses else ""))
    print(f"{len(documents) - failed} parsed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
