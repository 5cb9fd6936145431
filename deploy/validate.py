"""Offline validation of Kubernetes manifests; run it through validate.sh.

1. Schemas. Built-in kinds: the Kubernetes JSON schemas bundled in the
   kubernetes-validate package, strict variant (an unknown field is an error).
   Custom resources: the openAPIV3Schema of the upstream CRD files in schemas/,
   made strict the way the API server's fieldValidation=Strict (kubectl's
   default) is: unknown fields are errors wherever the CRD lists properties and
   does not say x-kubernetes-preserve-unknown-fields. Their metadata is checked
   against Kubernetes' ObjectMeta. CEL rules (x-kubernetes-validations) are not
   evaluated, except KEDA's minReplicaCount <= maxReplicaCount, by hand below.
2. What the API server checks beyond the schemas: names, label syntax,
   quantities, port names, selector vs template labels, volume mounts.
3. References between the given files: Service -> pods and ports,
   ServiceMonitor -> Service and port, ScaledObject -> Deployment, probes ->
   container ports, and the runner.toml of a container started with
   `--config` (grace_period vs terminationGracePeriodSeconds, folders on
   volumes, admin port and token).

Prints one line per problem, `ERROR <file>:<line>: <Kind>/<name>: <field>: <message>`,
and exits 1 if there was any.
"""

import argparse
import glob
import os
import re
import sys
import tomllib

import jsonschema
import kubernetes_validate.utils as kv
import yaml
from jsonschema.exceptions import best_match
from referencing import Registry, Resource

HERE = os.path.dirname(os.path.abspath(__file__))
DEFS_URI = "https://kubernetes.io/api/_definitions.json"
OBJECT_META = {"$ref": DEFS_URI + "#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
PORT_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$")
SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
          "n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ns|us|µs|ms|s|sec|secs|m|min|mins|h|hr|hrs|d|days?)")
DURATION_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "sec": 1, "secs": 1, "m": 60,
                 "min": 60, "mins": 60, "h": 3600, "hr": 3600, "hrs": 3600, "d": 86400, "day": 86400, "days": 86400}


class Doc:
    """One YAML document: its data, its node tree (for line numbers) and where it came from."""

    def __init__(self, path, node, data):
        self.path, self.node, self.data = path, node, data
        meta = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
        self.kind = data.get("kind")
        self.name = meta.get("name")

    @property
    def ident(self):
        return f"{self.kind}/{self.name}"

    def line(self, field):
        node, line = self.node, self.node.start_mark.line + 1
        for key in field:
            if isinstance(node, yaml.MappingNode):
                for k, v in node.value:
                    if k.value == key:
                        node, line = v, k.start_mark.line + 1
                        break
                else:
                    break
            elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
                node = node.value[key]
                line = node.start_mark.line + 1
            else:
                break
        return line


class Report:
    def __init__(self):
        self.errors = 0
        self.failed = set()  # ids of the documents with an error

    def error(self, doc, field, message, path=None, line=None):
        self.errors += 1
        self.failed.add(id(doc))
        where = show(path or doc.path)
        if line is None:
            line = doc.line(field) if doc else 0
        ident = f" {doc.ident}:" if doc else ""
        print(f"ERROR {where}:{line}:{ident} {dotted(field) or '(document)'}: {message}")


def show(path):
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def dotted(field):
    out = ""
    for key in field:
        if isinstance(key, int):
            out += f"[{key}]"
        elif re.search(r"[./]", str(key)):
            out += f'["{key}"]'
        else:
            out += f".{key}" if out else str(key)
    return out


def get(data, *keys, default=None):
    for key in keys:
        if isinstance(data, dict) and key in data:
            data = data[key]
        elif isinstance(data, list) and isinstance(key, int) and key < len(data):
            data = data[key]
        else:
            return default
    return data


# ---------------------------------------------------------------- loading

def load(path, report):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        report.error(None, [], f"cannot read: {e.strerror}", path=path, line=0)
        return []
    docs = []
    loader = yaml.SafeLoader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            for line, key in duplicate_keys(node):
                report.error(None, [], f"duplicate key {key!r} (kubectl rejects it)", path=path, line=line)
            data = loader.construct_document(node)
            if data is None:
                continue
            if not isinstance(data, dict):
                report.error(None, [], "a document must be a mapping", path=path, line=node.start_mark.line + 1)
                continue
            docs.append(Doc(path, node, data))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        report.error(None, [], f"not valid YAML: {getattr(e, 'problem', None) or e}", path=path,
                     line=mark.line + 1 if mark else 0)
    finally:
        loader.dispose()
    return docs


def duplicate_keys(node):
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode):
                if k.value in seen:
                    yield k.start_mark.line + 1, k.value
                seen.add(k.value)
            yield from duplicate_keys(v)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            yield from duplicate_keys(item)


# ---------------------------------------------------------------- schemas

class Schemas:
    def __init__(self, version, crd_dir):
        if version.startswith("v"):
            version = version[1:]
        known = [v for v in kv.all_versions() if kv.major_minor(v) == kv.major_minor(version)]
        if not known:
            bundled = dict.fromkeys(kv.major_minor(v) for v in kv.all_versions())
            print(f"validate: Kubernetes {version} is not bundled; choose one of {', '.join(bundled)}", file=sys.stderr)
            sys.exit(2)
        self.version = known[-1]
        self.dir = f"kubernetes-json-schema/v{self.version}-local-strict"
        defs = kv.schema_contents(f"{self.dir}/_definitions.json", self.version)
        self.registry = Resource.from_contents(defs) @ Registry()
        self.meta_validator = jsonschema.Draft202012Validator(OBJECT_META, registry=self.registry)
        self.crds = {}   # (apiVersion, kind) -> (crd file, validator)
        self.crd_kinds = {}  # kind -> served apiVersions
        for path in sorted(glob.glob(os.path.join(crd_dir, "*.yaml"))):
            with open(path, encoding="utf-8") as f:
                for crd in yaml.safe_load_all(f):
                    if not crd or crd.get("kind") != "CustomResourceDefinition":
                        continue
                    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
                    for v in crd["spec"]["versions"]:
                        if not v.get("served", True):
                            continue
                        schema = strict(v["schema"]["openAPIV3Schema"])
                        schema["properties"]["metadata"] = {"type": "object"}  # checked as ObjectMeta
                        api = f"{group}/{v['name']}"
                        self.crds[(api, kind)] = (path, jsonschema.Draft4Validator(schema))
                        self.crd_kinds.setdefault(kind, []).append(api)

    def check(self, doc, report):
        api, kind = doc.data.get("apiVersion"), doc.kind
        if not isinstance(api, str) or not isinstance(kind, str):
            report.error(doc, [], "needs apiVersion and kind (strings)")
            return False
        if (api, kind) in self.crds:
            _, validator = self.crds[(api, kind)]
            errors = list(validator.iter_errors(doc.data))
            meta = doc.data.get("metadata")
            if isinstance(meta, dict):
                errors += [prefixed(e, "metadata") for e in self.meta_validator.iter_errors(meta)]
        else:
            group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api)
            try:
                schema = kv.schema_contents(f"{self.dir}/{kind.lower()}-{group_version}.json", self.version)
            except FileNotFoundError:
                served = self.crd_kinds.get(kind)
                hint = (f"the CRD in schemas/ serves {', '.join(served)}" if served else
                        f"not a Kubernetes {kv.major_minor(self.version)} kind and no CRD for it in schemas/")
                report.error(doc, ["apiVersion"], f"no schema for {kind} {api}: {hint}")
                return False
            validator = jsonschema.Draft202012Validator(schema, registry=self.registry)
            errors = list(validator.iter_errors(doc.data))
        for e in sorted(errors, key=lambda e: list(map(str, e.absolute_path))):
            for field, message in explain(e):
                report.error(doc, field, message)
        return not errors


def strict(s):
    """A CRD's OpenAPI v3 schema as JSON Schema, unknown fields rejected."""
    if not isinstance(s, dict):
        return s
    out = {}
    for key, value in s.items():
        if key in ("properties", "patternProperties"):
            out[key] = {name: strict(sub) for name, sub in value.items()}
        elif key in ("items", "not") or (key == "additionalProperties" and isinstance(value, dict)):
            out[key] = strict(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [strict(sub) for sub in value]
        elif key.startswith("x-kubernetes-") or key in ("description", "default", "format", "nullable", "example"):
            continue
        else:
            out[key] = value
    if s.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if s.get("nullable"):
        if "type" in out:
            out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = list(out["enum"]) + [None]
    if ("properties" in s and "additionalProperties" not in s
            and not s.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    if s.get("x-kubernetes-list-type") == "set":
        out["uniqueItems"] = True
    return out


def prefixed(error, key):
    error.path.appendleft(key)
    return error


def explain(error):
    """(field, message) pairs for one schema error, naming the offending field itself."""
    field = list(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = set(error.schema.get("properties", {}))
        patterns = [re.compile(p) for p in error.schema.get("patternProperties", {})]
        extra = [k for k in error.instance if k not in allowed and not any(p.search(k) for p in patterns)]
        if extra:
            return [(field + [k], "unknown field") for k in extra]
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else "?"
        return [(field + [missing], "required field is missing")]
    if error.context:
        return explain(best_match(error.context))
    return [(field, error.message)]


# ---------------------------------------------------------------- API-server rules

def check_rules(doc, report):
    d = doc.data
    name = doc.name
    if not isinstance(name, str) or not name:
        report.error(doc, ["metadata", "name"], "required field is missing")
    elif doc.kind == "Service":
        if len(name) > 63 or not DNS_1035.match(name):
            report.error(doc, ["metadata", "name"], f"{name!r} is not a valid Service name (DNS-1035 label)")
    elif len(name) > 253 or not DNS_SUBDOMAIN.match(name):
        report.error(doc, ["metadata", "name"], f"{name!r} is not a valid name (DNS-1123 subdomain)")
    walk_labels(doc, d, [], report)
    if doc.kind == "Deployment":
        sel = get(d, "spec", "selector", "matchLabels", default={}) or {}
        labels = get(d, "spec", "template", "metadata", "labels", default={}) or {}
        for k, v in sel.items():
            if labels.get(k) != v:
                report.error(doc, ["spec", "selector", "matchLabels", k],
                             f"selector {k}={v} does not match the pod template's labels")
        pod = get(d, "spec", "template", "spec")
        if isinstance(pod, dict):
            check_pod(doc, pod, ["spec", "template", "spec"], report)
    if doc.kind == "Service":
        for i, port in enumerate(get(d, "spec", "ports", default=[]) or []):
            pname = port.get("name") if isinstance(port, dict) else None
            if pname is not None and (len(pname) > 63 or not DNS_LABEL.match(str(pname))):
                report.error(doc, ["spec", "ports", i, "name"], f"{pname!r} is not a valid port name (DNS label)")
    if doc.kind == "ScaledObject":  # the CRD's CEL rule
        lo, hi = get(d, "spec", "minReplicaCount"), get(d, "spec", "maxReplicaCount")
        if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
            report.error(doc, ["spec", "minReplicaCount"], "minReplicaCount must be less than or equal to maxReplicaCount")


def walk_labels(doc, value, field, report):
    if isinstance(value, dict):
        for k, v in value.items():
            if k in ("labels", "matchLabels") and isinstance(v, dict):
                for lk, lv in v.items():
                    prefix, _, lname = str(lk).rpartition("/")
                    if (prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix))) \
                            or len(lname) > 63 or not LABEL_NAME.match(lname):
                        report.error(doc, field + [k, lk], f"{lk!r} is not a valid label key")
                    if not isinstance(lv, str) or len(lv) > 63 or not LABEL_VALUE.match(lv):
                        report.error(doc, field + [k, lk], f"{lv!r} is not a valid label value (a string, 63 characters at most)")
            else:
                walk_labels(doc, v, field + [k], report)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            walk_labels(doc, v, field + [i], report)


def quantity(text):
    m = QUANTITY.match(str(text))
    if not m:
        return None
    number, suffix = float(m.group(1)), m.group(2) or ""
    if suffix[:1] in ("e", "E"):
        return number * 10 ** int(suffix[1:])
    return number * SUFFIX[suffix]


def check_pod(doc, pod, at, report):
    volumes = {v.get("name") for v in pod.get("volumes", []) or [] if isinstance(v, dict)}
    for group in ("initContainers", "containers"):
        for i, c in enumerate(pod.get(group, []) or []):
            if not isinstance(c, dict):
                continue
            here = at + [group, i]
            ports = c.get("ports", []) or []
            port_names = set()
            for j, p in enumerate(ports):
                pname = p.get("name") if isinstance(p, dict) else None
                if pname is None:
                    continue
                port_names.add(pname)
                if len(str(pname)) > 15 or not PORT_NAME.match(str(pname)) or "--" in str(pname) \
                        or not re.search("[a-z]", str(pname)):
                    report.error(doc, here + ["ports", j, "name"],
                                 f"{pname!r} is not a valid port name (IANA service name: 15 characters, a-z 0-9 -)")
            for j, m in enumerate(c.get("volumeMounts", []) or []):
                if isinstance(m, dict) and m.get("name") not in volumes:
                    report.error(doc, here + ["volumeMounts", j, "name"], f"no volume named {m.get('name')!r} in the pod")
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                for handler in ("httpGet", "tcpSocket", "grpc"):
                    port = get(c, probe, handler, "port")
                    if isinstance(port, str) and port not in port_names:
                        report.error(doc, here + [probe, handler, "port"],
                                     f"port {port!r} is not a named port of container {c.get('name')!r}")
            res = c.get("resources") or {}
            amounts = {}
            for kind in ("requests", "limits"):
                for rname, amount in (res.get(kind) or {}).items() if isinstance(res.get(kind), dict) else []:
                    value = quantity(amount)
                    if value is None:
                        report.error(doc, here + ["resources", kind, rname], f"{amount!r} is not a quantity")
                    amounts[(kind, rname)] = value
            for (kind, rname), value in amounts.items():
                limit = amounts.get(("limits", rname))
                if kind == "requests" and value is not None and limit is not None and value > limit:
                    report.error(doc, here + ["resources", "requests", rname],
                                 f"request {res['requests'][rname]} exceeds limit {res['limits'][rname]}")


# ---------------------------------------------------------------- references between files

def dicts(value):
    """The mappings in a list that may be missing or null."""
    return [v for v in value or [] if isinstance(v, dict)] if isinstance(value, list) else []


def containers(deployment):
    return dicts(get(deployment.data, "spec", "template", "spec", "containers"))


def matches(selector, labels):
    return isinstance(selector, dict) and bool(selector) and all((labels or {}).get(k) == v for k, v in selector.items())


def check_references(docs, report):
    of = lambda kind: [d for d in docs if d.kind == kind]
    deployments, services, configmaps = of("Deployment"), of("Service"), of("ConfigMap")

    for svc in services:
        sel = get(svc.data, "spec", "selector")
        if not deployments or not isinstance(sel, dict):
            continue
        targets = [d for d in deployments if matches(sel, get(d.data, "spec", "template", "metadata", "labels"))]
        if not targets:
            report.error(svc, ["spec", "selector"], "selects the pods of no Deployment in these files")
            continue
        ports = [p for d in targets for c in containers(d) for p in dicts(c.get("ports"))]
        names, numbers = {p.get("name") for p in ports}, {p.get("containerPort") for p in ports}
        for i, port in enumerate(get(svc.data, "spec", "ports", default=[]) or []):
            if not isinstance(port, dict):
                continue
            target = port.get("targetPort", port.get("port"))
            if (isinstance(target, str) and target not in names) or (isinstance(target, int) and target not in numbers):
                report.error(svc, ["spec", "ports", i, "targetPort" if "targetPort" in port else "port"],
                             f"{target!r} is not a container port of {', '.join(d.ident for d in targets)}")

    for sm in of("ServiceMonitor"):
        sel = get(sm.data, "spec", "selector", "matchLabels")
        if not services or not isinstance(sel, dict):
            continue
        targets = [s for s in services if matches(sel, get(s.data, "metadata", "labels"))]
        if not targets:
            report.error(sm, ["spec", "selector", "matchLabels"], "selects no Service in these files")
            continue
        names = {p.get("name") for s in targets for p in dicts(get(s.data, "spec", "ports"))}
        for i, ep in enumerate(get(sm.data, "spec", "endpoints", default=[]) or []):
            if isinstance(ep, dict) and "port" in ep and ep["port"] not in names:
                report.error(sm, ["spec", "endpoints", i, "port"],
                             f"{ep['port']!r} is not a port name of {', '.join(s.ident for s in targets)}")

    for so in of("ScaledObject"):
        ref = get(so.data, "spec", "scaleTargetRef", default={}) or {}
        if deployments and ref.get("kind", "Deployment") == "Deployment" and "name" in ref \
                and ref["name"] not in {d.name for d in deployments}:
            report.error(so, ["spec", "scaleTargetRef", "name"], f"no Deployment named {ref.get('name')!r} in these files")

    for dep in deployments:
        pod = get(dep.data, "spec", "template", "spec", default={}) or {}
        for i, c in enumerate(pod.get("containers", []) or []):
            if not isinstance(c, dict):
                continue
            args = [str(a) for a in (c.get("command", []) or []) + (c.get("args", []) or [])]
            if "--config" in args[:-1]:
                check_runner_toml(dep, pod, c, i, args[args.index("--config") + 1], configmaps, report)


def duration(text):
    text = str(text).strip()
    parts = DURATION.findall(text)
    if not parts or DURATION.sub("", text).strip():
        return None
    return sum(float(n) * DURATION_UNIT[u] for n, u in parts)


def check_runner_toml(dep, pod, c, index, config_path, configmaps, report):
    """The host's config as this container sees it, against the pod that runs it."""
    at = ["spec", "template", "spec", "containers", index]
    mounts = [m for m in c.get("volumeMounts", []) or [] if isinstance(m, dict)]
    volumes = {v.get("name"): v for v in pod.get("volumes", []) or [] if isinstance(v, dict)}
    source = None
    for m in mounts:
        mp = m.get("mountPath", "").rstrip("/")
        if m.get("subPath") and mp == config_path:
            source = (m, m["subPath"])
        elif not m.get("subPath") and config_path.startswith(mp + "/"):
            source = (m, config_path[len(mp) + 1:])
    if not source:
        report.error(dep, at + ["args"], f"--config {config_path} is on no volume of container {c.get('name')!r}")
        return
    mount, key = source
    cm_name = get(volumes.get(mount.get("name")), "configMap", "name")
    cm = next((d for d in configmaps if d.name == cm_name), None)
    if cm is None:
        return  # the config comes from elsewhere (a Secret, another file): nothing to read here
    text = get(cm.data, "data", key)
    if not isinstance(text, str):
        report.error(cm, ["data"], f"no key {key!r}, which {dep.ident} mounts as {config_path}")
        return
    field = ["data", key]
    try:
        cfg = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"line (\d+)", str(e))
        line = cm.line(field) + int(m.group(1)) if m else None
        report.error(cm, field, f"not valid TOML: {e}", line=line)
        return

    def toml_line(pattern):
        for n, line in enumerate(text.splitlines(), 1):
            if re.match(pattern, line.strip()):
                return cm.line(field) + n
        return None

    runner, admin, redis = cfg.get("runner", {}), cfg.get("admin", {}), cfg.get("redis", {})
    grace_text = runner.get("grace_period", "10s")
    grace = duration(grace_text)
    term = pod.get("terminationGracePeriodSeconds", 30)
    if grace is None:
        report.error(cm, field + ["runner", "grace_period"], f"{grace_text!r} is not a duration",
                     line=toml_line(r"grace_period\s*="))
    elif isinstance(term, int) and grace >= term:
        report.error(cm, field + ["runner", "grace_period"],
                     f"grace_period {grace_text} must be below {dep.ident}'s terminationGracePeriodSeconds ({term}), "
                     "or the kubelet kills the host before it hands its leases back",
                     line=toml_line(r"grace_period\s*="))
    if redis.get("managed") is True:
        report.error(cm, field + ["redis", "managed"], "managed = true would start a redis-server inside the pod",
                     line=toml_line(r"managed\s*="))
    base = os.path.dirname(config_path)
    for key_name, default, writable in (("plugins_dir", "plugins", False), ("cache_dir", ".hourglass/cache", True)):
        folder = os.path.normpath(os.path.join(base, str(runner.get(key_name, default))))
        mount = next((m for m in mounts if not m.get("subPath")
                      and (folder + "/").startswith(m.get("mountPath", "").rstrip("/") + "/")), None)
        if mount is None or (writable and mount.get("readOnly")):
            what = "no volume" if mount is None else "a read-only volume"
            report.error(cm, field + ["runner", key_name], f"{folder} is on {what} in container {c.get('name')!r}",
                         line=toml_line(rf"{key_name}\s*="))
    if admin.get("enabled"):
        listen = str(admin.get("listen", "127.0.0.1:9090"))
        host, _, port = listen.rpartition(":")
        ports = {p.get("containerPort") for p in c.get("ports", []) or [] if isinstance(p, dict)}
        if not port.isdigit() or int(port) not in ports:
            report.error(cm, field + ["admin", "listen"], f"{listen!r}: port is not a containerPort of {c.get('name')!r}",
                         line=toml_line(r"listen\s*="))
        loopback = host.strip("[]") in ("::1", "localhost") or host.startswith("127.")
        token = admin.get("token")
        if loopback:
            report.error(cm, field + ["admin", "listen"], f"{listen!r} is loopback: probes and Prometheus cannot reach it",
                         line=toml_line(r"listen\s*="))
        elif not isinstance(token, str) or len(token) < 8 or re.search(r"\s", token):
            report.error(cm, field + ["admin", "token"],
                         "a non-loopback listen needs token: 8 characters or more, no whitespace (the host refuses to start)",
                         line=toml_line(r"token\s*=") or toml_line(r"listen\s*="))


# ---------------------------------------------------------------- main

def main():
    parser = argparse.ArgumentParser(description="Validate Kubernetes manifests offline.")
    parser.add_argument("files", nargs="+", help="manifest files (.yaml); folders: their *.yaml")
    parser.add_argument("--kubernetes-version", default=os.environ.get("KUBERNETES_VERSION", kv.latest_version()),
                        help="schemas of this Kubernetes version (default: newest bundled)")
    parser.add_argument("--crds", default=os.path.join(HERE, "schemas"), help="folder of CustomResourceDefinition files")
    args = parser.parse_args()

    schemas = Schemas(args.kubernetes_version, args.crds)
    report = Report()
    files = []
    for f in args.files:
        files += sorted(glob.glob(os.path.join(f, "*.yaml"))) if os.path.isdir(f) else [f]
    docs = [d for f in files for d in load(f, report)]
    valid = [doc for doc in docs if schemas.check(doc, report)]
    for doc in valid:
        check_rules(doc, report)
    check_references(valid, report)  # between the documents whose shape is right
    crd_note = ", ".join(sorted({os.path.basename(p) for p, _ in schemas.crds.values()}))
    print(f"checked {len(docs)} resources in {len(files)} files: Kubernetes {kv.major_minor(schemas.version)} "
          f"strict schemas; CRDs from schemas/ ({crd_note})")
    failed = sum(id(d) in report.failed for d in docs)
    unattached = 1 if id(None) in report.failed else 0  # a file that did not parse
    print(f"validate: {len(docs) - failed} passed, {failed + unattached} failed")
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
