#!/usr/bin/env python3
"""A stand-in kube-scheduler extender for tests/e2e-k8s/smoke.sh (stdlib only).

    fake-extender.py PORT CALLS_FILE

Listens on 127.0.0.1:PORT and answers the verbs cluster.sh configures
(urlPrefix http://127.0.0.1:PORT, nodeCacheCapable: true):
  POST /filter      every candidate node passes
  POST /prioritize  score 5 for each node
  POST /bind        creates the pod's Binding through the API server, with the
                    admin kubeconfig's client certificate (env K8S_API, K8S_ROOT)
Each call appends one line "VERB NAMESPACE/POD [NODE]" to CALLS_FILE.
"""

import json
import os
import ssl
import sys
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(sys.argv[1])
CALLS = sys.argv[2]
API = os.environ["K8S_API"]
PKI = os.path.join(os.environ["K8S_ROOT"], "pki")


def record(line):
    with open(CALLS, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def bind(namespace, name, uid, node):
    ctx = ssl.create_default_context(cafile=os.path.join(PKI, "ca.crt"))
    ctx.load_cert_chain(os.path.join(PKI, "admin.crt"), os.path.join(PKI, "admin.key"))
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    req = urllib.request.Request(
        f"{API}/api/v1/namespaces/{namespace}/pods/{name}/binding",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
        resp.read()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, fmt, *args):  # keep stderr quiet
        pass

    def reply(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):  # noqa: N802 (http.server naming)
        n = int(self.headers.get("Content-Length", "0"))
        args = json.loads(self.rfile.read(n) or b"{}")
        verb = self.path.rstrip("/").rsplit("/", 1)[-1]
        if verb in ("filter", "prioritize"):
            # k8s.io/kube-scheduler/extender/v1 has no json tags: Go field names.
            meta = (args.get("Pod") or {}).get("metadata", {})
            nodes = args.get("NodeNames") or []
            record(f"{verb} {meta.get('namespace')}/{meta.get('name')} {','.join(nodes)}")
            if verb == "filter":
                self.reply({"NodeNames": nodes, "FailedNodes": {}, "Error": ""})
            else:
                self.reply([{"Host": h, "Score": 5} for h in nodes])
        elif verb == "bind":
            ns, name = args.get("PodNamespace"), args.get("PodName")
            node, uid = args.get("Node"), args.get("PodUID")
            try:
                bind(ns, name, uid, node)
                record(f"bind {ns}/{name} {node}")
                self.reply({"Error": ""})
            except Exception as e:  # reported to kube-scheduler
                record(f"bind-error {ns}/{name} {e}")
                self.reply({"Error": str(e)})
        else:
            self.send_error(404)


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
