"""Pod Security Standards checks for deploy/ (used by tests/system/deploy-test).

Implements the Kubernetes Pod Security Standards (kubernetes.io/docs/concepts/security/
pod-security-standards, "latest") for the pod templates we ship: the baseline controls and
the restricted controls on top. Written for this repository's manifests; it checks what a
pod spec says, like the PodSecurity admission controller, not what a runtime does.

  pss.py rendered FILE            every workload in FILE against its namespace's enforce label
  pss.py helm VALUES RENDERED DIR the argo-helm values agree with the component and pass baseline
  pss.py selftest                 known-bad pods are rejected (the checker can fail)
  pss.py netpol FILE              each network service admits only its Argo CD caller
  pss.py upstream DIR VERSION     fixtures in pod-security-admission's test/testdata layout agree
"""

import copy
import os
import sys

import yaml

BASELINE_CAPS = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}
# The "safe" sysctls as of policy version 1.37 (1.27, 1.29, 1.32 and 1.37 each added some).
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem", "net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_notsent_lowat",
}
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image", "persistentVolumeClaim",
    "projected", "secret",
}
SELINUX_TYPES = (None, "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t")
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
LEVELS = ("privileged", "baseline", "restricted")


def containers(spec):
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(key) or []:
            yield c


def user_namespaced(spec):
    """`hostUsers: false`: since policy 1.35 this relaxes procMount (baseline) and the
    runAsNonRoot / runAsUser controls (restricted)."""
    return spec.get("hostUsers") is False


def windows(spec):
    """`os.name: windows` exempts a pod from the Linux-only restricted controls (1.25+)."""
    return (spec.get("os") or {}).get("name") == "windows"


def probe_hosts(c):
    """Hosts named by a container's probes and lifecycle handlers (forbidden since 1.34)."""
    handlers = [c.get(k) for k in ("livenessProbe", "readinessProbe", "startupProbe")]
    handlers += [(c.get("lifecycle") or {}).get(k) for k in ("postStart", "preStop")]
    for h in handlers:
        for kind in ("httpGet", "tcpSocket"):
            host = ((h or {}).get(kind) or {}).get("host")
            if host:
                yield host


def baseline(spec, meta=None):
    """Violations of the baseline profile, as readable strings."""
    bad = []
    psc = spec.get("securityContext") or {}
    for f in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(f):
            bad.append(f"{f}: true")
    if (psc.get("windowsOptions") or {}).get("hostProcess"):
        bad.append("hostProcess")
    for v in spec.get("volumes") or []:
        if "hostPath" in v:
            bad.append(f"hostPath volume {v['name']}")
    for s in psc.get("sysctls") or []:
        if s["name"] not in SAFE_SYSCTLS:
            bad.append(f"unsafe sysctl {s['name']}")
    for key, value in ((meta or {}).get("annotations") or {}).items():
        if key.startswith(APPARMOR_ANNOTATION) and value and value != "runtime/default" \
                and not value.startswith("localhost/"):
            bad.append(f"annotation {key}={value}")
    for ctx_name, ctx in [("pod", psc)] + [(c["name"], c.get("securityContext") or {}) for c in containers(spec)]:
        if (ctx.get("seccompProfile") or {}).get("type") == "Unconfined":
            bad.append(f"{ctx_name}: seccomp Unconfined")
        if (ctx.get("appArmorProfile") or {}).get("type") not in (None, "RuntimeDefault", "Localhost"):
            bad.append(f"{ctx_name}: AppArmor {ctx['appArmorProfile']['type']}")
        se = ctx.get("seLinuxOptions") or {}
        if se.get("type") not in SELINUX_TYPES:
            bad.append(f"{ctx_name}: SELinux type {se['type']}")
        if se.get("user") or se.get("role"):
            bad.append(f"{ctx_name}: SELinux user/role set")
    for c in containers(spec):
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            bad.append(f"{c['name']}: privileged")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            bad.append(f"{c['name']}: hostProcess")
        extra = set((sc.get("capabilities") or {}).get("add") or []) - BASELINE_CAPS
        if extra:
            bad.append(f"{c['name']}: capabilities beyond baseline {sorted(extra)}")
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                bad.append(f"{c['name']}: hostPort {p['hostPort']}")
        if sc.get("procMount") not in (None, "Default") and not user_namespaced(spec):
            bad.append(f"{c['name']}: procMount {sc['procMount']}")
        for host in probe_hosts(c):
            bad.append(f"{c['name']}: probe or lifecycle host {host}")
    return bad


def restricted(spec, meta=None):
    """Violations of the restricted profile (baseline included)."""
    bad = baseline(spec, meta)
    psc = spec.get("securityContext") or {}
    for v in spec.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            bad.append(f"volume {v['name']}: type {sorted(kinds)} not allowed")
    userns = user_namespaced(spec)
    if psc.get("runAsUser") == 0 and not userns:
        bad.append("pod: runAsUser 0")
    if psc.get("runAsNonRoot") is False and not userns:
        bad.append("pod: runAsNonRoot false")
    for c in containers(spec):
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("procMount") not in (None, "Default") and userns:
            bad.append(f"{name}: procMount {sc['procMount']}")  # baseline lets it pass
        if not userns:
            non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
            if non_root is not True:
                bad.append(f"{name}: runAsNonRoot not true")
            if sc.get("runAsUser") == 0:
                bad.append(f"{name}: runAsUser 0")
        if windows(spec):
            continue
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{name}: allowPrivilegeEscalation not false")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{name}: seccompProfile {seccomp!r}, must be RuntimeDefault or Localhost")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            bad.append(f"{name}: capabilities.drop lacks ALL")
        extra = set(caps.get("add") or []) - {"NET_BIND_SERVICE"}
        if extra:
            bad.append(f"{name}: capabilities.add {sorted(extra)} not allowed")
    return bad


def check(spec, level, meta=None):
    return {"privileged": lambda s, m: [], "baseline": baseline, "restricted": restricted}[level](spec, meta)


def pod_specs(docs):
    """(object, pod spec, pod metadata) for every workload in docs."""
    for d in docs:
        kind = d.get("kind")
        if kind == "Pod":
            yield d, d["spec"], d.get("metadata")
        elif kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
            yield d, d["spec"]["template"]["spec"], d["spec"]["template"].get("metadata")
        elif kind == "CronJob":
            t = d["spec"]["jobTemplate"]["spec"]["template"]
            yield d, t["spec"], t.get("metadata")


def cmd_rendered(path):
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    levels = {
        d["metadata"]["name"]: (d["metadata"].get("labels") or {}).get("pod-security.kubernetes.io/enforce")
        for d in docs if d["kind"] == "Namespace"
    }
    failed = False
    for obj, spec, meta in pod_specs(docs):
        ns = obj["metadata"].get("namespace")
        level = levels.get(ns)
        if level not in LEVELS[1:]:
            print(f"FAIL {path}: namespace {ns!r} of {obj['kind']}/{obj['metadata']['name']} claims no "
                  f"baseline/restricted enforce level")
            failed = True
            continue
        bad = check(spec, level, meta)
        host_users = spec.get("hostUsers", True)
        if bad:
            failed = True
            print(f"FAIL {obj['kind']}/{obj['metadata']['name']} violates PSS {level}:")
            for b in bad:
                print(f"        - {b}")
        else:
            print(f"PASS {obj['kind']}/{obj['metadata']['name']}: PSS {level} "
                  f"(hostUsers: {str(host_users).lower()})")
        # Our own claim on top: cmp-warden never needs more than these three capabilities.
        for c in containers(spec):
            if c["name"] == "cmp-warden":
                sc = c.get("securityContext") or {}
                added = set((sc.get("capabilities") or {}).get("add") or [])
                if not added <= {"SETUID", "SETGID", "SETPCAP"} or sc.get("readOnlyRootFilesystem") is not True \
                        or sc.get("allowPrivilegeEscalation") is not False \
                        or "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
                    print("FAIL cmp-warden container: needs drop ALL, add ⊆ {SETUID, SETGID, SETPCAP}, "
                          "a read-only root filesystem and allowPrivilegeEscalation: false")
                    failed = True
    if failed:
        sys.exit(1)


def cmd_helm(values_path, rendered_path, components, *configmap_paths):
    """argo-helm values: the extra containers and volumes are exactly the kustomize components'
    (COMPONENTS: comma-separated component directories, in order), every ConfigMap they mount is
    one the chart renders in sidecar mode (with the keys mounted), and the repo-server pod of
    RENDERED with them passes PSS baseline."""
    values = yaml.safe_load(open(values_path))
    docs = [d for d in yaml.safe_load_all(open(rendered_path)) if d]
    dep = next(d for d in docs if d["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    rs = values["repoServer"]
    failed = []
    want_c, want_v = [], []
    for comp in components.split(","):
        patch = yaml.safe_load(open(os.path.join(comp, "sidecar.yaml")))["spec"]["template"]["spec"]
        want_c += patch["containers"]
        want_v += patch["volumes"]
    if rs["extraContainers"] != want_c:
        failed.append(f"extraContainers differ from the containers of {components}")
    if rs["volumes"] != want_v:
        failed.append(f"volumes differ from the volumes of {components}")
    vols = {v["name"] for v in rs["volumes"]} | {"plugins"}
    for c in rs["extraContainers"]:
        for m in c["volumeMounts"]:
            if m["name"] not in vols:
                failed.append(f"{c['name']}: volumeMount {m['name']} has no volume")
    rendered = {}
    for path in configmap_paths:
        for d in yaml.safe_load_all(open(path)):
            if d and d["kind"] == "ConfigMap":
                rendered[d["metadata"]["name"]] = set(d["data"])
    for v in rs["volumes"]:
        if "configMap" not in v:
            continue
        name = v["configMap"]["name"]
        if name not in rendered:
            failed.append(f"volume {v['name']}: ConfigMap {name} is not one the chart renders")
            continue
        for item in v["configMap"].get("items", []):
            if item["key"] not in rendered[name]:
                failed.append(f"volume {v['name']}: ConfigMap {name} has no key {item['key']}")
    if values["global"]["securityContext"].get("fsGroup") != 999:
        failed.append("global.securityContext.fsGroup must be 999 (socket group)")
    # The pod the chart would render: its repo-server pod plus these sidecars and volumes.
    spec = copy.deepcopy(pod)
    names = {c["name"] for c in rs["extraContainers"]}
    spec["containers"] = [c for c in spec["containers"] if c["name"] not in names] + rs["extraContainers"]
    vnames = {v["name"] for v in rs["volumes"]}
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] not in vnames] + rs["volumes"]
    spec["securityContext"] = values["global"]["securityContext"]
    failed += baseline(spec)
    if failed:
        print(f"FAIL {values_path}:")
        for f in failed:
            print(f"        - {f}")
        sys.exit(1)
    print(f"PASS {values_path}: the kustomize build's sidecars ({', '.join(sorted(names))}), ConfigMaps the chart renders, pod passes PSS baseline")


def cmd_compose(composed_path, operator_path, ours_path, rendered_path):
    """deploy/helm/argo-values: COMPOSED (its output for the operator's values OPERATOR) keeps
    every one of the operator's settings, with their containers, init containers and volumes
    first and unchanged; adds exactly the sidecar and volumes of OURS (deploy/helm/values.yaml)
    with CAP_CHOWN and --socket-owner 0:999 instead of a pod-wide fsGroup; and the repo-server
    pod of RENDERED with them passes PSS baseline."""
    composed = yaml.safe_load(open(composed_path))
    operator = yaml.safe_load(open(operator_path))
    ours = yaml.safe_load(open(ours_path))["repoServer"]
    failed = []
    if {k: v for k, v in composed.items() if k != "repoServer"} != {k: v for k, v in operator.items() if k != "repoServer"}:
        failed.append("settings outside repoServer changed (a global.securityContext would reach every Argo CD pod)")
    rs, op = composed["repoServer"], operator.get("repoServer", {})
    for k in set(op) - {"extraContainers", "volumes", "podAnnotations"}:
        if rs.get(k) != op[k]:
            failed.append(f"repoServer.{k} changed")
    annotations = dict(rs.get("podAnnotations", {}))
    if len(annotations.pop("checksum/cmp-warden", "x" * 64)) != 64 or annotations != op.get("podAnnotations", {}):
        failed.append("repoServer.podAnnotations are not the operator's (plus checksum/cmp-warden)")
    sidecar = copy.deepcopy(ours["extraContainers"][0])
    sidecar["securityContext"]["capabilities"]["add"].append("CHOWN")
    sidecar["args"] += ["--socket-owner", "0:999"]
    if rs["extraContainers"] != op.get("extraContainers", []) + [sidecar]:
        failed.append("extraContainers are not the operator's, then cmp-warden's (with CHOWN and --socket-owner 0:999)")
    if rs["volumes"] != op.get("volumes", []) + ours["volumes"]:
        failed.append("volumes are not the operator's, then cmp-warden's")
    docs = [d for d in yaml.safe_load_all(open(rendered_path)) if d]
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    spec = copy.deepcopy(pod)
    names = {c["name"] for c in rs["extraContainers"]}
    spec["containers"] = [c for c in spec["containers"] if c["name"] not in names] + rs["extraContainers"]
    spec["initContainers"] = rs.get("initContainers", [])
    vnames = {v["name"] for v in rs["volumes"]}
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] not in vnames] + rs["volumes"]
    spec.pop("securityContext", None)
    failed += baseline(spec)
    if failed:
        print(f"FAIL {composed_path}:")
        for f in failed:
            print(f"        - {f}")
        sys.exit(1)
    print(f"PASS deploy/helm/argo-values: {operator_path.split('/')[-1]} kept ({', '.join(c['name'] for c in op.get('extraContainers', []))} and their volumes), cmp-warden added, no pod-wide fsGroup, pod passes PSS baseline")


def cmd_selftest():
    good = {"containers": [{"name": "a", "securityContext": {
        "runAsNonRoot": True, "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}}]}
    assert restricted(good) == [], restricted(good)
    cases = [
        ("baseline", lambda s: s.update(hostPID=True)),
        ("baseline", lambda s: s["containers"][0]["securityContext"].update(privileged=True)),
        ("baseline", lambda s: s["containers"][0]["securityContext"]["capabilities"].update(add=["SYS_ADMIN"])),
        ("baseline", lambda s: s.update(volumes=[{"name": "h", "hostPath": {"path": "/"}}])),
        ("baseline", lambda s: s["containers"][0]["securityContext"].update(seccompProfile={"type": "Unconfined"})),
        ("baseline", lambda s: s["containers"][0].update(ports=[{"containerPort": 80, "hostPort": 80}])),
        ("restricted", lambda s: s["containers"][0]["securityContext"]["capabilities"].update(add=["SETUID"])),
        ("restricted", lambda s: s["containers"][0]["securityContext"].update(runAsNonRoot=False)),
        ("restricted", lambda s: s["containers"][0]["securityContext"].pop("allowPrivilegeEscalation")),
        ("restricted", lambda s: s["containers"][0]["securityContext"].pop("seccompProfile")),
        ("restricted", lambda s: s["containers"][0]["securityContext"].update(runAsUser=0)),
    ]
    for level, mutate in cases:
        spec = copy.deepcopy(good)
        mutate(spec)
        assert check(spec, level), f"selftest: a bad pod passed {level}: {spec}"
    print(f"PASS PSS checker rejects all {len(cases)} known-bad pods")


# Which Argo CD component may call each network service.
CALLERS = {"cmp-warden-service": "argocd-repo-server",
           "cmp-warden": "argocd-repo-server",  # the Helm chart's Deployment (release cmp-warden)
           "cmp-warden-appset": "argocd-applicationset-controller"}


def cmd_netpol(path):
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    pols = [d for d in docs if d["kind"] == "NetworkPolicy"]
    failed = False
    for dep in (d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] in CALLERS):
        name = dep["metadata"]["name"]
        labels = dep["spec"]["template"]["metadata"]["labels"]
        mine = [p for p in pols if all(labels.get(k) == v for k, v in
                                       p["spec"]["podSelector"].get("matchLabels", {}).items())]
        ports = {p["containerPort"] for c in dep["spec"]["template"]["spec"]["containers"]
                 for p in c.get("ports", [])}
        problems = []
        if len(mine) != 1:
            problems.append(f"{len(mine)} NetworkPolicies select it, want 1")
        else:
            spec = mine[0]["spec"]
            if sorted(spec.get("policyTypes", [])) != ["Egress", "Ingress"] or spec.get("egress"):
                problems.append("must restrict Ingress and deny all Egress")
            for rule in spec.get("ingress", []):
                for src in rule.get("from", []):
                    app = ((src.get("podSelector") or {}).get("matchLabels") or {}).get("app.kubernetes.io/name")
                    ns = ((src.get("namespaceSelector") or {}).get("matchLabels") or {}).get(
                        "kubernetes.io/metadata.name")
                    rule_ports = {p["port"] for p in rule.get("ports", [])}
                    if app == CALLERS[name] and rule_ports and rule_ports <= ports:
                        continue
                    if ns == "monitoring" and rule_ports == {9464}:
                        continue
                    problems.append(f"ingress from {src} on {sorted(rule_ports)} is broader than {CALLERS[name]}")
                if not rule.get("from") or not rule.get("ports"):
                    problems.append("an ingress rule without from/ports admits everyone")
        if problems:
            failed = True
            print(f"FAIL NetworkPolicy for {name}: " + "; ".join(problems))
        else:
            print(f"PASS NetworkPolicy for {name}: ingress only from {CALLERS[name]} (+ monitoring on 9464), no egress")
    if failed:
        sys.exit(1)


def cmd_upstream(root, version):
    """Classify fixtures laid out as kubernetes/pod-security-admission's test/testdata
    (LEVEL/VERSION/{pass,fail}/*.yaml, one Pod each) and fail on any disagreement."""
    import glob
    import os
    counts, wrong = {}, []
    for level in LEVELS[1:]:
        for outcome in ("pass", "fail"):
            files = sorted(glob.glob(os.path.join(root, level, version, outcome, "*.yaml")))
            counts[(level, outcome)] = len(files)
            for f in files:
                pod = yaml.safe_load(open(f))
                bad = check(pod["spec"], level, pod.get("metadata"))
                if (outcome == "pass") == bool(bad):
                    wrong.append(f"{level}/{version}/{outcome}/{os.path.basename(f)}: we say "
                                 + ("; ".join(bad) if bad else "allowed"))
    total = sum(counts.values())
    if not all(counts.values()):
        print(f"FAIL {root}: no fixtures for " + ", ".join(
            f"{lvl} {out}" for (lvl, out), n in counts.items() if not n))
        sys.exit(1)
    for w in wrong:
        print(f"FAIL {w}")
    if wrong:
        sys.exit(1)
    print(f"PASS {root} {version}: all {total} fixtures classified as the fixture says "
          + ", ".join(f"{lvl} {out} {n}" for (lvl, out), n in counts.items()))


if __name__ == "__main__":
    {"rendered": cmd_rendered, "helm": cmd_helm, "selftest": cmd_selftest,
     "netpol": cmd_netpol, "upstream": cmd_upstream, "compose": cmd_compose}[sys.argv[1]](*sys.argv[2:])
