#!/usr/bin/env python3
"""Parses scripts/deploy/kubernetes.yaml and checks what docs/failover.md promises
of it: a Deployment of 2 with a /readyz readiness probe and --ha_* flags, a
Service on 8336 and a PodDisruptionBudget, all selecting the same pods.
Exits non-zero with a message on the first failure."""
import sys

import yaml


def main(path):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    by_kind = {}
    for doc in docs:
        for key in ("apiVersion", "kind", "metadata"):
            assert key in doc, f"a document without {key}: {doc}"
        by_kind.setdefault(doc["kind"], []).append(doc)
    for kind in ("Deployment", "Service", "PodDisruptionBudget", "Secret"):
        assert len(by_kind.get(kind, [])) == 1, f"want one {kind}, have {len(by_kind.get(kind, []))}"
    deployment = by_kind["Deployment"][0]
    spec = deployment["spec"]
    assert spec["replicas"] == 2, "a Deployment of 2"
    labels = spec["selector"]["matchLabels"]
    assert spec["template"]["metadata"]["labels"] == labels, "the template carries the selector's labels"
    (container,) = spec["template"]["spec"]["containers"]
    probe = container["readinessProbe"]["httpGet"]
    assert probe["path"] == "/readyz", "readiness is /readyz"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert probe["port"] in ports or probe["port"] in ports.values(), "the probe's port is the container's"
    args = " ".join(container["args"])
    for flag in ("--ha_etcd_endpoints=", "--ha_lease_ttl="):
        assert flag in args, f"{flag} is passed"
    secret_ref = container["envFrom"][0]["secretRef"]["name"]
    secret = by_kind["Secret"][0]
    assert secret_ref == secret["metadata"]["name"], "the Secret the container reads"
    assert "YADCC_SERVING_DAEMON_TOKEN_SECRET" in secret["stringData"], "HA needs the shared secret"
    service = by_kind["Service"][0]["spec"]
    assert service["selector"] == labels, "the Service selects the Deployment's pods"
    assert [p["port"] for p in service["ports"]] == [8336], "the Service listens on 8336"
    pdb = by_kind["PodDisruptionBudget"][0]["spec"]
    assert pdb["selector"]["matchLabels"] == labels, "the budget covers the Deployment's pods"
    assert pdb.get("minAvailable") == 1, "the budget keeps one"
    print(f"{path}: {len(docs)} documents, as promised")


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except AssertionError as error:
        sys.exit(f"{sys.argv[1]}: {error}")
