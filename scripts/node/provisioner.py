#!/usr/bin/env python3
"""The e2e node's volume provisioner (scripts/node.sh starts it beside the kubelet).

Every second: a PersistentVolumeClaim that is Pending with no volume gets a
hostPath PersistentVolume of its own, pre-bound to it (claimRef), under
VOLUMES_DIR/pvc-<claim uid> (mode 0777: pods run as any uid, and hostPath
volumes get no fsGroup); kube-controller-manager's binder binds the pair. A
Released volume of this node (its claim deleted) is deleted with its directory.
What a local-path provisioner does, without helper pods (the node has no
registry to pull their image from).

  provisioner.py KUBECTL KUBECONFIG NODE_NAME VOLUMES_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import time

LABEL = "distrain.io/node-provisioner"


def kubectl(args, stdin=None):
    r = subprocess.run([KUBECTL, "--kubeconfig", KUBECONFIG, "--request-timeout=10s"] + args,
                       input=stdin, capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def provision():
    rc, out, err = kubectl(["get", "pvc", "-A", "-o", "json"])
    if rc != 0:
        print(f"listing claims: {err.strip()}", flush=True)
        return
    for c in json.loads(out).get("items", []):
        meta, spec = c["metadata"], c.get("spec", {})
        if c.get("status", {}).get("phase") != "Pending" or spec.get("volumeName") or "deletionTimestamp" in meta:
            continue
        name = "pvc-" + meta["uid"]
        path = os.path.join(VOLUMES, name)
        os.makedirs(path, exist_ok=True)
        os.chmod(path, 0o777)
        pv = {"apiVersion": "v1", "kind": "PersistentVolume",
              "metadata": {"name": name, "labels": {LABEL: NODE}},
              "spec": {"capacity": {"storage": spec.get("resources", {}).get("requests", {}).get("storage", "1Gi")},
                       "accessModes": spec.get("accessModes", ["ReadWriteOnce"]),
                       "persistentVolumeReclaimPolicy": "Retain",
                       "storageClassName": spec.get("storageClassName", ""),
                       "hostPath": {"path": path, "type": "Directory"},
                       "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                    "namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]}}}
        rc, _, err = kubectl(["create", "-f", "-"], json.dumps(pv))
        if rc == 0:
            print(f"provisioned {name} for claim {meta['namespace']}/{meta['name']} at {path}", flush=True)
        elif "AlreadyExists" not in err:
            print(f"provisioning {name}: {err.strip()}", flush=True)


def reclaim():
    rc, out, err = kubectl(["get", "pv", "-l", f"{LABEL}={NODE}", "-o", "json"])
    if rc != 0:
        return
    for v in json.loads(out).get("items", []):
        if v.get("status", {}).get("phase") != "Released":
            continue
        name, path = v["metadata"]["name"], v["spec"].get("hostPath", {}).get("path", "")
        rc, _, err = kubectl(["delete", "pv", name, "--wait=false"])
        if rc == 0 or "NotFound" in err:
            if path.startswith(VOLUMES + "/"):  # only what this provisioner made
                shutil.rmtree(path, ignore_errors=True)
            print(f"reclaimed {name} (its claim is gone)", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    KUBECTL, KUBECONFIG, NODE, VOLUMES = sys.argv[1:]
    VOLUMES = os.path.abspath(VOLUMES)
    os.makedirs(VOLUMES, exist_ok=True)
    print(f"provisioning hostPath volumes under {VOLUMES} for node {NODE}", flush=True)
    while True:
        provision()
        reclaim()
        time.sleep(1)
