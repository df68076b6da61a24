"""The Lease store's credentials, loaded by the official ``kubernetes`` client's loaders
(rdmanet.ipam.kube_config.connect), against the fake API server over real HTTP(S): bearer token,
token file (rotated without a restart), exec plugin, client certificates from files and data, CA
file and data, insecure-skip-tls-verify, tls-server-name, the context's namespace, in-cluster; and
the CNI errors when they are refused or unusable."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone

import pytest

from rdmanet.cni.core import skel
from rdmanet.cni.linux import roots
from rdmanet.cni.core.errors import INVALID_CONFIG, IO_FAILURE, TRY_AGAIN_LATER, CNIError
from rdmanet.ipam import kube_config
from rdmanet.ipam.kube_config import connect, kube_settings
from rdmanet.ipam.plugin import LeaseIPAM
from rdmanet.ipam.store.kube_transport import ApiClientTransport

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kube_api_server import KubeAPIServer  # noqa: E402
from policy_file import with_keys  # noqa: E402
from lease_objects import claim_leases  # noqa: E402

NS = "ipam"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"


def kubeconfig(path, server, user=None, cluster=None, namespace=NS):
    """A JSON kubeconfig (JSON is YAML) for ``server``; ``user`` / ``cluster`` add to the entries."""
    ctx = {"cluster": "c", "user": "u"}
    if namespace:
        ctx["namespace"] = namespace
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "ctx",
           "clusters": [{"name": "c", "cluster": {"server": server, **(cluster or {})}}],
           "users": [{"name": "u", "user": user or {}}],
           "contexts": [{"name": "ctx", "context": ctx}]}
    path.write_text(json.dumps(doc))
    return str(path)


def netconf(kubeconfig_path, **kube):
    return {"cniVersion": "1.0.0", "name": "net-h", "type": "macvlan",
            "ipam": {"type": "lease-ipam", "range": "10.3.0.0/29",
                     "kubernetes": {"kubeconfig": str(kubeconfig_path), "timeout_seconds": 2, **kube}}}


def env(command, cid="c1"):
    return {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": "net1",
            "CNI_PATH": "/opt/cni/bin", "RDMANET_NODE_NAME": "node-h",
            "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p;K8S_POD_UID=uid-1"}


def call(command, conf, cid="c1"):
    return skel.handle(LeaseIPAM(), env(command, cid), json.dumps(conf).encode())


def transport(path, **kube) -> ApiClientTransport:
    return connect(kube_settings(netconf(path, **kube))).transport()


def auth_headers(server):
    return [e["authorization"] for e in server.request_log() if e["verb"] is not None]


# -- bearer tokens ----------------------------------------------------------------------------------

def test_a_rejected_token_is_a_cni_error_naming_the_credentials(tmp_path):
    with KubeAPIServer(token="right") as server:
        path = kubeconfig(tmp_path / "kc", server.url, user={"token": "wrong"})
        code, out = call("ADD", netconf(path))
        assert code != 0 and out["code"] == IO_FAILURE
        assert "HTTP 401" in out["msg"] and "credentials" in out["details"]
        assert claim_leases(server, NS) == []


def test_token_file_is_read_again_after_rotation(tmp_path):
    with KubeAPIServer(token="first") as server:
        token = tmp_path / "token"
        token.write_text("first\n")
        path = kubeconfig(tmp_path / "kc", server.url, user={"tokenFile": "token"})  # relative to the kubeconfig
        t = transport(path)
        assert t.request("GET", LEASES, [], None, 5).status == 200
        server.token = "second-token"
        replacement = tmp_path / "token.new"
        replacement.write_text("second-token\n")
        os.replace(replacement, token)  # as kubelet rotates projected tokens
        assert t.request("GET", LEASES, [], None, 5).status == 200
        # refused once, then the kubeconfig's credentials are loaded again: no restart
        assert auth_headers(server) == ["Bearer first", "Bearer first", "Bearer second-token"]


def test_the_context_namespace_and_k8s_api_root(tmp_path, monkeypatch):
    with KubeAPIServer() as server:
        path = kubeconfig(tmp_path / "kc", "http://127.0.0.1:9", namespace="ctx-ns")  # nothing listens there
        monkeypatch.setenv(roots.POLICY_ENV, str(with_keys(tmp_path / "policy.json", apiRoots=[server.url])))
        conn = connect(kube_settings(netconf(path, k8s_api_root=server.url + "/")))
        assert conn.namespace == "ctx-ns"
        assert conn.transport().request("GET", "/apis/coordination.k8s.io/v1/namespaces/ctx-ns/leases", [], None,
                                        5).status == 200
        assert conn.transport() is conn.transport()  # one keep-alive pool per connection


def test_an_unusable_kubeconfig_names_the_field(tmp_path):
    path = tmp_path / "kc"
    path.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    code, out = call("ADD", netconf(path))
    assert out["code"] == INVALID_CONFIG
    assert "ipam.kubernetes.kubeconfig" in out["msg"] and "current-context" in out["msg"]


def test_yaml_kubeconfig(tmp_path):
    with KubeAPIServer(token="y") as server:
        path = tmp_path / "kc"
        path.write_text(textwrap.dedent(f"""\
            apiVersion: v1
            kind: Config
            clusters:
            - name: c
              cluster:
                server: {server.url}
            users:
            - name: u
              user:
                token: y
            contexts:
            - name: ctx
              context: {{cluster: c, user: u, namespace: {NS}}}
            current-context: ctx
        """))
        code, out = call("ADD", netconf(path))
        assert code == 0 and out["ips"][0]["address"] == "10.3.0.1/29"


def test_watch_streams_events(tmp_path):
    with KubeAPIServer() as server:
        t = transport(kubeconfig(tmp_path / "kc", server.url))
        rv = t.request("GET", LEASES, [], None, 5).doc["metadata"]["resourceVersion"]
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l1"}, "spec": {}}
        assert t.request("POST", LEASES, [], lease, 5).status == 201
        stream = t.watch(LEASES, [("watch", "true"), ("resourceVersion", rv), ("timeoutSeconds", "1")], 5)
        try:
            events = list(stream.events())
        finally:
            stream.close()
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "l1")]


# -- exec credential plugins ------------------------------------------------------------------------

EXEC_PLUGIN = """#!{python}
import json, os, sys
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
with open(os.environ["LOG"], "a") as fh:
    fh.write(json.dumps(info) + "\\n")
mode = os.environ.get("MODE", "token")
if mode == "fail":
    print("no credentials for you", file=sys.stderr)
    sys.exit(3)
status = {{}}
if mode == "cert":
    status = {{"clientCertificateData": open(os.environ["CERT"]).read(), "clientKeyData": open(os.environ["KEY"]).read()}}
else:
    status = {{"token": open(os.environ["TOKEN_FILE"]).read().strip()}}
if os.environ.get("EXPIRY"):
    status["expirationTimestamp"] = os.environ["EXPIRY"]
print(json.dumps({{"apiVersion": info["apiVersion"], "kind": "ExecCredential", "status": status}}))
"""


@pytest.fixture
def exec_plugin(tmp_path):
    script = tmp_path / "cred-plugin"
    script.write_text(EXEC_PLUGIN.format(python=sys.executable))
    script.chmod(0o755)
    return script


def exec_user(tmp_path, api_version="client.authentication.k8s.io/v1", provide=False, **env_vars):
    log = tmp_path / "exec.log"
    items = [{"name": "LOG", "value": str(log)}] + [{"name": k, "value": v} for k, v in env_vars.items()]
    return {"exec": {"apiVersion": api_version, "command": "./cred-plugin", "args": [], "env": items,
                     "provideClusterInfo": provide, "interactiveMode": "Never"}}


def runs(tmp_path):
    log = tmp_path / "exec.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.parametrize("api_version", ["client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"])
def test_exec_plugin_token_is_kept_until_it_expires(tmp_path, exec_plugin, api_version):
    (tmp_path / "token").write_text("from-exec")
    later = (datetime.now(timezone.utc) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    with KubeAPIServer(token="from-exec") as server:
        path = kubeconfig(tmp_path / "kc", server.url,
                          user=exec_user(tmp_path, api_version, provide=True, TOKEN_FILE=str(tmp_path / "token"),
                                         EXPIRY=later))
        code, out = call("ADD", netconf(path))
        assert code == 0, out
        assert call("DEL", netconf(path)) == (0, None)
    (info,) = runs(tmp_path)  # ADD and DEL (List, create, List, delete) on one answer
    assert info["apiVersion"] == api_version and info["kind"] == "ExecCredential"
    assert info["spec"]["interactive"] is False and info["spec"]["cluster"]["server"] == server.url


def test_exec_plugin_is_asked_again_when_expired_and_after_a_401(tmp_path, exec_plugin):
    token = tmp_path / "token"
    token.write_text("one")
    past = (datetime.now(timezone.utc) - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    with KubeAPIServer(token="one") as server:
        expired = kubeconfig(tmp_path / "kc", server.url,
                             user=exec_user(tmp_path, TOKEN_FILE=str(token), EXPIRY=past))
        t = transport(expired)
        assert t.request("GET", LEASES, [], None, 5).status == 200
        assert t.request("GET", LEASES, [], None, 5).status == 200
        assert len(runs(tmp_path)) == 3  # to load the kubeconfig, then before each request: its answer had expired
        assert "cluster" not in runs(tmp_path)[0]["spec"]  # provideClusterInfo false
        lasting = kubeconfig(tmp_path / "kc2", server.url, user=exec_user(tmp_path, TOKEN_FILE=str(token)))
        t = transport(lasting)
        assert t.request("GET", LEASES, [], None, 5).status == 200
        server.token = "two"  # revoked: the cached answer is refused, the plugin is asked once more
        token.write_text("two")
        assert t.request("GET", LEASES, [], None, 5).status == 200
        assert len(runs(tmp_path)) == 5
        assert auth_headers(server)[-2:] == ["Bearer one", "Bearer two"]


def test_a_failing_exec_plugin_is_a_cni_error_with_its_message(tmp_path, exec_plugin):
    with KubeAPIServer() as server:
        path = kubeconfig(tmp_path / "kc", server.url, user=exec_user(tmp_path, MODE="fail"))
        code, out = call("ADD", netconf(path))
        assert out["code"] == IO_FAILURE
        assert "returned 3" in out["msg"] and "no credentials for you" in out["msg"]
        assert server.count() == 0


# -- TLS --------------------------------------------------------------------------------------------

def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 and kube.example, a client certificate, another CA."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (scripts/test.sh installs it)")
    d = tmp_path_factory.mktemp("pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.crt", "-days", "2", "-subj", f"/CN={ca}",
                cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:kube.example\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, ext in (("server", "server.ext"), ("client", "client.ext")):
        openssl("req", "-new", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.crt", "-days", "2", "-extfile", ext, cwd=d)
    return d


@pytest.fixture
def mtls_server(pki):
    with KubeAPIServer(tls=(str(pki / "server.crt"), str(pki / "server.key")), client_ca=str(pki / "ca.crt")) as srv:
        yield srv


def b64(path):
    return base64.b64encode(path.read_bytes()).decode()


def test_client_certificate_and_ca_from_files(tmp_path, pki, mtls_server):
    for name in ("ca.crt", "client.crt", "client.key"):
        shutil.copy(pki / name, tmp_path / name)
    path = kubeconfig(tmp_path / "kc", mtls_server.url, cluster={"certificate-authority": "ca.crt"},
                      user={"client-certificate": "client.crt", "client-key": "client.key"})
    code, out = call("ADD", netconf(path))
    assert code == 0 and out["ips"][0]["address"] == "10.3.0.1/29"
    headers = auth_headers(mtls_server)  # every request the ADD made (how many is the store's business)
    assert headers and set(headers) == {None}  # the certificate is the credential: no token was sent


def test_client_certificate_and_ca_as_data(tmp_path, pki, mtls_server):
    path = kubeconfig(tmp_path / "kc", mtls_server.url, cluster={"certificate-authority-data": b64(pki / "ca.crt")},
                      user={"client-certificate-data": b64(pki / "client.crt"),
                            "client-key-data": b64(pki / "client.key")})
    code, out = call("ADD", netconf(path))
    assert code == 0, out
    assert not [n for n in os.listdir(tmp_path) if n.startswith("rdmanet-kube-")]


def test_exec_plugin_client_certificate(tmp_path, pki, exec_plugin, mtls_server):
    path = kubeconfig(tmp_path / "kc", mtls_server.url, cluster={"certificate-authority-data": b64(pki / "ca.crt")},
                      user=exec_user(tmp_path, MODE="cert", CERT=str(pki / "client.crt"), KEY=str(pki / "client.key")))
    code, out = call("ADD", netconf(path))
    assert code == 0, out
    assert len(runs(tmp_path)) == 1


def test_a_server_the_ca_did_not_sign_is_refused_unless_verification_is_off(tmp_path, pki):
    with KubeAPIServer(tls=(str(pki / "server.crt"), str(pki / "server.key"))) as server:
        wrong = kubeconfig(tmp_path / "kc", server.url, cluster={"certificate-authority": str(pki / "other-ca.crt")})
        code, out = call("ADD", netconf(wrong))
        assert out["code"] == TRY_AGAIN_LATER and "CERTIFICATE_VERIFY_FAILED" in out["msg"]
        skip = kubeconfig(tmp_path / "kc2", server.url, cluster={"insecure-skip-tls-verify": True})
        code, out = call("ADD", netconf(skip))
        assert code == 0, out


def test_tls_server_name(tmp_path, pki):
    with KubeAPIServer(tls=(str(pki / "server.crt"), str(pki / "server.key"))) as server:
        url = server.url.replace("127.0.0.1", "localhost")  # not in the certificate ...
        cluster = {"certificate-authority": str(pki / "ca.crt")}
        bad = kubeconfig(tmp_path / "kc", url, cluster=cluster)
        assert call("ADD", netconf(bad))[1]["code"] == TRY_AGAIN_LATER
        named = kubeconfig(tmp_path / "kc2", url, cluster={**cluster, "tls-server-name": "kube.example"})  # ... this is
        code, out = call("ADD", netconf(named))
        assert code == 0, out


def test_in_cluster_service_account(tmp_path, pki, monkeypatch):
    with KubeAPIServer(tls=(str(pki / "server.crt"), str(pki / "server.key")), token="sa-token") as server:
        sa = tmp_path / "sa"
        sa.mkdir()
        shutil.copy(pki / "ca.crt", sa / "ca.crt")
        (sa / "token").write_text("sa-token")
        (sa / "namespace").write_text(NS)
        monkeypatch.setattr(kube_config, "SA_DIR", str(sa))
        monkeypatch.setattr(kube_config, "_cache", {})  # this process's in-cluster connection is the test's alone
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(server.port))
        conn = connect(kube_config.KubeSettings())
        assert conn.namespace == NS
        assert conn.transport().request("GET", LEASES, [], None, 5).status == 200
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
        kube_config._cache.clear()
        with pytest.raises(CNIError) as err:
            connect(kube_config.KubeSettings())
        assert err.value.code == INVALID_CONFIG and "no in-cluster config" in err.value.msg


def test_a_ca_that_does_not_load_is_a_config_error(tmp_path):
    path = kubeconfig(tmp_path / "kc", "https://127.0.0.1:9",
                      cluster={"certificate-authority-data": base64.b64encode(b"not a certificate").decode()})
    code, out = call("ADD", netconf(path))
    assert out["code"] == INVALID_CONFIG
    assert "ipam.kubernetes.kubeconfig" in out["msg"] and "certificate authority" in out["msg"]
