"""deploy/kubernetes/ checked offline: the built-in kinds against the Kubernetes OpenAPI schemas
bundled in PyPI `kubernetes-validate` (strict: unknown fields fail), the ServiceMonitor and
PrometheusRule against prometheus-operator's CRD schemas as generated into the models of PyPI
`cloudcoil.models.prometheus_operator` (read back unchanged: unknown fields fail), the
PrometheusRule against its generator, the manifests against each other and against the config
in the ConfigMap, which a real agent runs."""

from __future__ import annotations

import copy
import os
import importlib.util
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from procs import SpecwatchProcess, decode_line, free_port, wait_for
from specwatch.config import load_config

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
RULES = ROOT / "deploy" / "prometheus" / "specwatch-rules.yml"
# The oldest and the newest Kubernetes whose schemas kubernetes-validate 1.37 bundles.
KUBE_VERSIONS = ("1.25", "1.37")
OPERATOR_KINDS = ("ServiceMonitor", "PrometheusRule")


def manifests() -> dict[str, dict]:
    """Every resource of the kustomization, by kind."""
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    out = {}
    for name in kust["resources"]:
        for doc in yaml.safe_load_all((K8S / name).read_text()):
            assert doc["kind"] not in out, f"two {doc['kind']}s"
            out[doc["kind"]] = doc
    return out


def pod_spec() -> dict:
    return manifests()["DaemonSet"]["spec"]["template"]["spec"]


def agent() -> dict:
    [c] = pod_spec()["containers"]
    return c


def configmap_config() -> str:
    return manifests()["ConfigMap"]["data"]["config.yaml"]



# --- schemas ------------------------------------------------------------------------------

def test_kustomization_lists_every_manifest():
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk
    assert set(manifests()) == {"Namespace", "ServiceAccount", "ConfigMap", "DaemonSet", "Service",
                                *OPERATOR_KINDS}


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_builtin_kinds_validate_against_kubernetes_schemas(version):
    kv = pytest.importorskip("kubernetes_validate", reason="pip install '.[test]'")
    for kind, doc in manifests().items():
        if kind in OPERATOR_KINDS:
            continue
        assert kv.validate(doc, version, strict=True) == version, kind


@pytest.mark.parametrize("break_it, where", [
    (lambda c: c["securityContext"].update(readOnlyRootFilesystem="yes"), "readOnlyRootFilesystem"),
    (lambda c: c["securityContext"].update(runAsNonroot=True), "runAsNonroot"),
    (lambda c: c["resources"]["limits"].update(memory=[128]), "memory"),
])
def test_kubernetes_schema_check_catches_a_broken_daemonset(break_it, where):
    kv = pytest.importorskip("kubernetes_validate", reason="pip install '.[test]'")
    ds = copy.deepcopy(manifests()["DaemonSet"])
    break_it(ds["spec"]["template"]["spec"]["containers"][0])
    with pytest.raises(kv.ValidationError) as e:
        kv.validate(ds, KUBE_VERSIONS[-1], strict=True)
    assert where in str(e.value)


@pytest.fixture(scope="module")
def operator_models():
    """prometheus-operator's monitoring.coreos.com/v1 kinds (v0.80.1 CRD schemas) as models."""
    v1 = pytest.importorskip("cloudcoil.models.prometheus_operator.v1", reason="pip install '.[test]'")
    return {"ServiceMonitor": v1.ServiceMonitor, "PrometheusRule": v1.PrometheusRule}


def operator_check(models, doc: dict) -> None:
    """Raises when `doc` breaks its CRD schema (pydantic.ValidationError) or holds a field the
    schema does not know (AssertionError: the model reads it back without that field)."""
    model = models[doc["kind"]].model_validate(doc)
    assert model.model_dump(by_alias=True, exclude_unset=True, mode="json") == doc, "unknown or changed field"


def test_operator_kinds_validate_against_their_crd_schemas(operator_models):
    docs = manifests()
    for kind in OPERATOR_KINDS:
        operator_check(operator_models, docs[kind])


@pytest.mark.parametrize("kind, break_it", [
    ("ServiceMonitor", lambda s: s["endpoints"][0].update(interval="30 seconds")),
    ("ServiceMonitor", lambda s: s["endpoints"][0].update(intervall="30s")),
    ("ServiceMonitor", lambda s: s.pop("selector")),
    ("PrometheusRule", lambda s: s["groups"][1]["rules"][0].pop("expr")),
    ("PrometheusRule", lambda s: s["groups"][1]["rules"][0].update(fore="2m")),
])
def test_crd_schema_check_catches_broken_resources(operator_models, kind, break_it):
    doc = copy.deepcopy(manifests()[kind])
    break_it(doc["spec"])
    with pytest.raises(Exception) as e:
        operator_check(operator_models, doc)
    assert type(e.value).__name__ in ("ValidationError", "AssertionError")


def test_kustomize_renders_and_validates(tmp_path):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed (its `kubectl kustomize` renders the kustomization offline)")
    kv = pytest.importorskip("kubernetes_validate", reason="pip install '.[test]'")
    r = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    docs = list(yaml.safe_load_all(r.stdout))
    assert sorted(d["kind"] for d in docs) == sorted(manifests())
    for d in docs:
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "specwatch", d["kind"]
        if d["kind"] not in OPERATOR_KINDS:
            kv.validate(d, KUBE_VERSIONS[-1], strict=True)
    [ds] = [d for d in docs if d["kind"] == "DaemonSet"]
    images = {c["image"] for c in ds["spec"]["template"]["spec"]["containers"] + ds["spec"]["template"]["spec"]["initContainers"]}
    assert images == {f"specwatch:{project_version()}"}


# --- the PrometheusRule is the Prometheus rules file -------------------------------------

def test_prometheusrule_is_generated_from_the_rules_file():
    r = subprocess.run([sys.executable, str(K8S / "generate.py"), "--check"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    rule = manifests()["PrometheusRule"]
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    assert (K8S / "prometheusrule.yaml").read_text().startswith("# GENERATED by deploy/kubernetes/generate.py")


def test_generator_check_fails_on_a_stale_rule(tmp_path):
    spec = importlib.util.spec_from_file_location("k8s_generate", K8S / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    edited = RULES.read_text().replace("for: 2m", "for: 3m", 1)
    stale = yaml.safe_load(gen.render(edited))["spec"]
    assert stale != manifests()["PrometheusRule"]["spec"] and stale == yaml.safe_load(edited)
    gen.OUT = tmp_path / "prometheusrule.yaml"
    gen.OUT.write_text(gen.render(edited))
    with pytest.raises(SystemExit, match="out of date"):
        gen.main(["--check"])
    with pytest.raises(ValueError, match="groups"):
        gen.render("rules: []\n")


# --- the manifests agree with each other, the image and the config -----------------------

def project_version() -> str:
    return re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)


def test_daemonset_is_hardened():
    spec = pod_spec()
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] > 0 and pod["fsGroup"] == pod["runAsGroup"]
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    assert manifests()["ServiceAccount"]["automountServiceAccountToken"] is False
    for key in ("hostPID", "hostIPC", "hostNetwork"):
        assert not spec.get(key), key
    c = agent()
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == pod["runAsUser"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]} and not sc.get("privileged")
    # every host path is mounted read-only but the state directory
    volumes = {v["name"]: v for v in spec["volumes"]}
    host = {m["mountPath"]: m for m in c["volumeMounts"] if "hostPath" in volumes[m["name"]]}
    assert {p for p, m in host.items() if not m.get("readOnly")} == {"/var/lib/specwatch"}
    assert "/var/log/pods" in host
    # the one root step: chown of the state directory, with CHOWN alone
    [init] = spec["initContainers"]
    isc = init["securityContext"]
    assert isc["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert isc["allowPrivilegeEscalation"] is False and isc["readOnlyRootFilesystem"] is True
    assert f"chown {pod['runAsUser']}:{pod['runAsGroup']} \"$d\"" in init["command"][-1] and "d=/var/lib/specwatch;" in init["command"][-1]
    assert [m["mountPath"] for m in init["volumeMounts"]] == ["/var/lib/specwatch"]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv (util-linux)")
def test_init_container_command_succeeds_on_every_start(tmp_path):
    """The init command as the pod runs it (root with CAP_CHOWN alone), on a fresh root-owned
    directory, then again on the directory it handed over (a restart): both exit 0, 0700, agent's."""
    [init] = pod_spec()["initContainers"]
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    script = init["command"][-1].replace("/var/lib/specwatch", str(state))
    caps = ["setpriv", "--inh-caps=-all,+chown", "--ambient-caps=-all", "--bounding-set=-all,+chown", "--"]
    for start in ("first start", "restart"):
        r = subprocess.run([*caps, *init["command"][:-1], script], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, (start, r.stderr)
        st = state.stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (65532, 65532, 0o700), start


def test_daemonset_gets_nvml_without_taking_a_gpu():
    c = agent()
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and "utility" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")
    assert pod_spec()["runtimeClassName"] == "nvidia"
    for part in ("requests", "limits"):
        assert not any(k.startswith("nvidia.com/") for k in c["resources"][part])


def test_resources_match_the_budgets():
    res = agent()["resources"]
    mib = {"Mi": 1, "Gi": 1024}
    limit = int(res["limits"]["memory"][:-2]) * mib[res["limits"]["memory"][-2:]]
    request = int(res["requests"]["memory"][:-2]) * mib[res["requests"]["memory"][-2:]]
    # RSS < 60 MB with NVML (README, Performance): requested, with room for a backlog read
    assert 60 <= request <= limit <= 256
    assert res["requests"]["cpu"].endswith("m") and int(res["requests"]["cpu"][:-1]) <= 50


def test_manifests_agree_with_the_config_and_the_image():
    docs = manifests()
    spec, c = pod_spec(), agent()
    cfg = yaml.safe_load(configmap_config())
    [port] = c["ports"]
    assert cfg["metrics"] == {"listen_address": "0.0.0.0", "listen_port": port["containerPort"]}
    for probe, path in (("readinessProbe", "/-/ready"), ("livenessProbe", "/-/healthy")):
        assert c[probe]["httpGet"] == {"path": path, "port": port["name"]}
    # Service -> pods, ServiceMonitor -> Service port by name
    svc = docs["Service"]
    assert svc["spec"]["selector"].items() <= docs["DaemonSet"]["spec"]["template"]["metadata"]["labels"].items()
    [sp] = svc["spec"]["ports"]
    assert sp["targetPort"] == port["name"] and sp["port"] == port["containerPort"]
    sm = docs["ServiceMonitor"]["spec"]
    assert sm["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert [e["port"] for e in sm["endpoints"]] == [sp["name"]] and "jobLabel" not in sm
    # the job is the Service's name: SpecwatchDown asks up{job="specwatch"}
    assert f'up{{job="{svc["metadata"]["name"]}"}}' in (K8S / "prometheusrule.yaml").read_text()
    # config file and state directory where the container finds them
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    [(cm_vol, cm_path)] = [(n, p) for n, p in mounts.items() if "configMap" in volumes[n]]
    assert volumes[cm_vol]["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]
    assert c["args"] == ["run", "--config", f"{cm_path}/config.yaml"]
    state = [n for n, p in mounts.items() if p == cfg["state_dir"]]
    assert state and volumes[state[0]]["hostPath"]["path"] == cfg["state_dir"]
    for entry in cfg["logs"]:
        assert entry["path"].startswith(mounts["pod-logs"] + "/")
    # the image: its uid and command are the DaemonSet's, its tag the project's version
    dockerfile = (ROOT / "Dockerfile").read_text()
    pod = spec["securityContext"]
    assert re.search(rf"^USER {pod['runAsUser']}:{pod['runAsGroup']}$", dockerfile, re.M)
    assert dockerfile.startswith("#") and "FROM python:3.11-slim" in dockerfile
    assert f'CMD {c["args"]}'.replace("'", '"') in dockerfile and 'ENTRYPOINT ["specwatch"]' in dockerfile
    [image] = yaml.safe_load((K8S / "kustomization.yaml").read_text())["images"]
    assert image["newTag"] == project_version()
    assert {x["image"] for x in spec["containers"] + spec["initContainers"]} == {f"specwatch:{project_version()}"}


# --- the ConfigMap's config, checked and run ---------------------------------------------

def check_config(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specwatch", "check-config", str(path)], capture_output=True,
                          text=True, timeout=60)


def test_configmap_config_checks_with_the_keys_that_exist(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(configmap_config())
    r = check_config(cfg)
    assert r.returncode == 0, r.stderr
    assert "1 log file(s), metrics on 0.0.0.0:9849" in r.stdout and "process watching off" in r.stdout


def test_configmap_config_checks_with_its_cri_keys(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(configmap_config())
    r = check_config(cfg)
    assert r.returncode == 0, r.stderr
    [log] = load_config(str(cfg)).logs
    assert log.path == "/var/log/pods/*_sglang-*_*/*/*.log"


def run_configmap_config(tmp_path: Path, text: str, pod_files: dict[str, str] | None = None) -> SpecwatchProcess:
    """The agent on the ConfigMap's config with the node's paths moved under tmp_path and a free
    port; `pod_files` (path under /var/log/pods -> text) written before it starts."""
    pods = tmp_path / "var/log/pods"
    pods.mkdir(parents=True)
    for rel, content in (pod_files or {}).items():
        (pods / rel).parent.mkdir(parents=True, exist_ok=True)
        (pods / rel).write_text(content)
    port = free_port()
    text = (text.replace("/var/log/pods/", f"{pods}/").replace("/var/lib/specwatch", str(tmp_path / "state"))
            .replace("listen_port: 9849", f"listen_port: {port}"))
    assert str(pods) in text and str(port) in text
    cfg = tmp_path / "config.yaml"
    cfg.write_text(text)
    return SpecwatchProcess(cfg, port).start()


def test_probes_answer_on_the_agent_the_configmap_configures(tmp_path):
    proc = run_configmap_config(tmp_path, configmap_config())
    try:
        c = agent()
        for probe, answer in (("readinessProbe", b"specwatch is Ready.\n"), ("livenessProbe", b"specwatch is Healthy.\n")):
            url = f"http://127.0.0.1:{proc.port}{c[probe]['httpGet']['path']}"

            def ok():
                try:
                    with urllib.request.urlopen(url, timeout=c[probe]["timeoutSeconds"]) as resp:
                        return resp.status == 200 and resp.read() == answer
                except urllib.error.HTTPError as e:  # 503 until the backlog is read
                    assert e.code == 503 and probe == "readinessProbe", (probe, e.code)
                    return False

            wait_for(ok, what=f"{probe} {url} answering 200")
    finally:
        assert proc.stop() == 0, proc.output


def test_configmap_config_reads_a_cri_file_as_the_pod_named(tmp_path):
    line = "2026-11-30T10:00:00.123456789Z stderr F " + decode_line(2.5, "10:00:00")
    proc = run_configmap_config(tmp_path, configmap_config(), {
        "llm_sglang-0_0f1e2d3c-aaaa-bbbb-cccc-123456789abc/sglang/0.log": line,
        "llm_router-0_0f1e2d3c-aaaa-bbbb-cccc-123456789abd/router/0.log": line,  # not an sglang-* pod
    })
    try:
        servers = wait_for(lambda: {dict(labels)["server"]: v for (name, labels), v in proc.scrape().items()
                                    if name == "specwatch_accept_length"}, timeout=20, what="accept length")
        assert servers == {"sglang-0": 2.5}
    finally:
        assert proc.stop() == 0, proc.output
