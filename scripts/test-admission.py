#!/usr/bin/env python3
"""test-admission.py — the admission policies in deploy/ against sample admission requests.

    python3 scripts/test-admission.py     # needs PyPI cel-python and PyYAML (deploy/validate-requirements.txt)

For each ValidatingAdmissionPolicy in deploy/*-policy.yaml and its binding, each sample request goes
through what the API server does with them, in the same order:

  1. the policy's matchConstraints.resourceRules (operation, resource and subresource);
  2. the binding's namespaceSelector, against the labels the API server gives every namespace
     (kubernetes.io/metadata.name: <name>);
  3. the policy's matchConditions (a false one: the policy does not apply);
  4. its variables, in order, then its validations: a false one refuses the request, with the
     messageExpression's text (else the message).

The CEL is evaluated by cel-python (pinned in deploy/validate-requirements.txt), not by the API server's
cel-go with the Kubernetes libraries, so the policies keep to the standard subset both have (has(),
in, exists, ternaries, string concatenation). A CEL error fails the test (under failurePolicy Fail
the API server would refuse the request; here it would be a policy bug). Variables are evaluated
eagerly, where the API server evaluates them when first used: stricter, so every variable must be
safe on every request the policy matches. Not emulated: type checking against the OpenAPI schema,
cost limits, objectSelector (refused if a binding uses one). Checked statically instead: the enum
fields the schema check does not cover, and that no expression uses one of CEL's reserved words as
a field name (cel-python takes `request.namespace`; the API server's CEL does not compile it before
Kubernetes 1.32).

Prints `ok`/`FAIL` per case and exits 1 if any failed. Runs offline.
"""
import copy
import glob
import os
import re
import sys

import celpy
import yaml

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SKIP = "runtimeproxy.koordinator.sh/skip-hookserver"
STATUS = "scheduling.koordinator.sh/resource-status"
SPEC = "node.koordinator.sh/extended-resource-spec"

ALICE = "alice@example.com"
RS_CONTROLLER = "system:serviceaccount:kube-system:replicaset-controller"
DS_CONTROLLER = "system:serviceaccount:kube-system:daemon-set-controller"
KOORD_SCHEDULER = "system:serviceaccount:koordinator-system:koord-scheduler"
KOORD_MANAGER = "system:serviceaccount:koordinator-system:koord-manager"
KUBE_SCHEDULER = "system:kube-scheduler"
KUBELET = "system:node:node-1"

ENV = celpy.Environment()
RESERVED = re.compile(r"\.(as|break|const|continue|else|for|function|if|import|let|loop|package|namespace|return|var|void|while)\b")


# --- the API server's side -------------------------------------------------------------------------


def load_policies():
    """{policy name: (policy, binding, file)} for every ValidatingAdmissionPolicy in deploy/."""
    policies, bindings = {}, {}
    for path in sorted(glob.glob(os.path.join(ROOT, "deploy", "*.yaml"))):
        for doc in yaml.safe_load_all(open(path)):
            if not doc:
                continue
            if doc["kind"] == "ValidatingAdmissionPolicy":
                policies[doc["metadata"]["name"]] = (doc, os.path.relpath(path, ROOT))
            elif doc["kind"] == "ValidatingAdmissionPolicyBinding":
                bindings[doc["spec"]["policyName"]] = doc
    out = {}
    for name, (policy, path) in policies.items():
        if name not in bindings:
            raise SystemExit(f"{path}: policy {name} has no binding")
        out[name] = (policy, bindings[name], path)
    return out


def selector_matches(selector, labels):
    """A metav1.LabelSelector against a map of labels."""
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def rule_matches(rules, req):
    resource = req["resource"]["resource"] + ("/" + req["subResource"] if req["subResource"] else "")
    for r in rules:
        if req["operation"] in r["operations"] or "*" in r["operations"]:
            if req["resource"]["group"] in r["apiGroups"] and resource in r["resources"]:
                return True
    return False


def cel(expr, activation):
    """Evaluates expr; a CEL error is raised (cel-python returns some, raises others)."""
    result = ENV.program(ENV.compile(expr)).evaluate(activation)
    if isinstance(result, celpy.CELEvalError):
        raise result
    return result


def admit(policy, binding, req, obj, old):
    """(allowed, message): what the API server answers for this policy and binding."""
    spec, match = policy["spec"], binding["spec"].get("matchResources") or {}
    if not rule_matches(spec["matchConstraints"]["resourceRules"], req):
        return True, "not matched (rules)"
    if "objectSelector" in match:
        raise SystemExit("objectSelector: not emulated by this test")
    ns_labels = {"kubernetes.io/metadata.name": req["namespace"]}
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": req["namespace"], "labels": ns_labels}}
    if not selector_matches(match.get("namespaceSelector") or {}, ns_labels):
        return True, "not matched (namespaceSelector)"
    act = {
        "object": celpy.json_to_cel(obj),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel(req),
        "namespaceObject": celpy.json_to_cel(namespace),
    }
    for c in spec.get("matchConditions") or []:
        if not cel(c["expression"], act):
            return True, f"not matched (matchCondition {c['name']})"
    variables = {}
    for v in spec.get("variables") or []:
        act["variables"] = celpy.celtypes.MapType(variables)
        variables[celpy.celtypes.StringType(v["name"])] = cel(v["expression"], act)
    act["variables"] = celpy.celtypes.MapType(variables)
    for v in spec["validations"]:
        if not cel(v["expression"], act):
            msg = v.get("message", "")
            if "messageExpression" in v:
                msg = str(cel(v["messageExpression"], act))
            return False, msg
    return True, "allowed"


# --- sample requests ---------------------------------------------------------------------------------


def pod(ns, labels=None, annotations=None, containers=None, init=None):
    p = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": ns},
        "spec": {"containers": containers or [{"name": "main", "image": "busybox"}]},
    }
    if labels is not None:
        p["metadata"]["labels"] = labels
    if annotations is not None:
        p["metadata"]["annotations"] = annotations
    if init:
        p["spec"]["initContainers"] = init
    return p


def batch(requests=None, limits=None, name="main"):
    res = {}
    if requests:
        res["requests"] = requests
    if limits:
        res["limits"] = limits
    return {"name": name, "image": "busybox", "resources": res}


def binding_obj(ns, annotations=None):
    b = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p", "namespace": ns},
         "target": {"apiVersion": "v1", "kind": "Node", "name": "node-1"}}
    if annotations is not None:
        b["metadata"]["annotations"] = annotations
    return b


def request(op, ns, user, sub="", name="p"):
    kind = "Binding" if sub == "binding" else "Pod"
    return {
        "operation": op,
        "namespace": ns,
        "name": name,
        "subResource": sub,
        "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
    }


def create(ns, user, obj, sub=""):
    return request("CREATE", ns, user, sub), obj, None


def update(ns, user, old, new, sub=""):
    return request("UPDATE", ns, user, sub), new, old


def daemonset_pod():
    """The pod deploy/runtime-hooks.yaml's DaemonSet creates, in its namespace."""
    ds = yaml.safe_load(open(os.path.join(ROOT, "deploy", "runtime-hooks.yaml")))
    t = copy.deepcopy(ds["spec"]["template"])
    assert t["metadata"]["labels"].get(SKIP) == "true", "the DaemonSet's pods carry the skip label"
    ns = ds["metadata"]["namespace"]
    p = {"apiVersion": "v1", "kind": "Pod", "metadata": dict(t["metadata"], name="runtime-hooks-x", namespace=ns),
         "spec": t["spec"]}
    return ns, p


SL = "runtime-proxy-skip-hookserver-label"
KA = "runtime-proxy-koordinator-annotations"
T, F = {SKIP: "true"}, {SKIP: "false"}
ALLOW, DENY = True, False
RS = '{"cpuset": "2-3"}'
ERS = '{"containers":{"main":{"limits":{"kubernetes.io/batch-cpu":"1k"},"requests":{"kubernetes.io/batch-cpu":"1k"}}}}'
BE = {"koordinator.sh/qosClass": "BE"}


def cases():
    ds_ns, ds_pod = daemonset_pod()
    plain = pod("default", labels={"app": "x"})
    labelled = pod("default", labels={"app": "x", **T})
    return [
        # --- the skip label ---
        (SL, "koordlet's pod with the label in koordinator-system", ALLOW,
         create("koordinator-system", DS_CONTROLLER, pod("koordinator-system", labels=T))),
        (SL, "a pod with the label in kube-system", ALLOW, create("kube-system", ALICE, pod("kube-system", labels=T))),
        (SL, f"deploy/runtime-hooks.yaml's pod in {ds_ns}", ALLOW, create(ds_ns, DS_CONTROLLER, ds_pod)),
        (SL, "a pod with the label in default", DENY, create("default", ALICE, labelled), "namespace default"),
        (SL, "a pod with the label =false in default (any value)", DENY, create("default", ALICE, pod("default", labels=F))),
        (SL, "a Deployment's pod with the label in team-a (replicaset-controller)", DENY,
         create("team-a", RS_CONTROLLER, pod("team-a", labels=T)), "namespace team-a"),
        (SL, "a pod without labels in default", ALLOW, create("default", ALICE, pod("default"))),
        (SL, "a pod with the key as an annotation, not a label", ALLOW, create("default", ALICE, pod("default", annotations=T))),
        (SL, "update adding the label in default", DENY, update("default", ALICE, plain, labelled)),
        (SL, "update changing the label false -> true in default", DENY,
         update("default", ALICE, pod("default", labels=F), pod("default", labels=T))),
        (SL, "update of a pod labelled before the policy, label kept", ALLOW,
         update("default", ALICE, labelled, pod("default", labels={"app": "y", **T}))),
        (SL, "update removing the label in default", ALLOW, update("default", ALICE, labelled, plain)),
        (SL, "pods/status update adding the label in default", DENY, update("default", KUBELET, plain, labelled, "status")),
        (SL, "pods/status update, label kept", ALLOW, update("default", KUBELET, labelled, labelled, "status")),
        (SL, "update adding the label in kube-system", ALLOW,
         update("kube-system", ALICE, pod("kube-system"), pod("kube-system", labels=T))),
        # --- scheduling.koordinator.sh/resource-status ---
        (KA, "a pod with resource-status, created by a user", DENY, create("default", ALICE, pod("default", annotations={STATUS: RS})),
         ALICE),
        (KA, "a pod with resource-status, created from a template (replicaset-controller)", DENY,
         create("default", RS_CONTROLLER, pod("default", annotations={STATUS: RS}))),
        (KA, "a pod with resource-status in kube-system, created by a user", DENY,
         create("kube-system", ALICE, pod("kube-system", annotations={STATUS: RS}))),
        (KA, "a pod without these annotations", ALLOW, create("default", ALICE, pod("default", annotations={"a": "b"}))),
        (KA, "koord-scheduler patching resource-status in (bind)", ALLOW,
         update("default", KOORD_SCHEDULER, pod("default"), pod("default", annotations={STATUS: RS}))),
        (KA, "koord-scheduler's binding carrying resource-status", ALLOW,
         create("default", KOORD_SCHEDULER, binding_obj("default", {STATUS: RS}), "binding")),
        (KA, "kube-scheduler's binding without annotations", ALLOW,
         create("default", KUBE_SCHEDULER, binding_obj("default"), "binding")),
        (KA, "a user's binding carrying resource-status", DENY,
         create("default", ALICE, binding_obj("default", {STATUS: RS}), "binding")),
        (KA, "a user adding resource-status", DENY,
         update("default", ALICE, pod("default"), pod("default", annotations={STATUS: RS}))),
        (KA, "a user changing resource-status", DENY,
         update("default", ALICE, pod("default", annotations={STATUS: RS}), pod("default", annotations={STATUS: '{"cpuset": "0-7"}'}))),
        (KA, "a user removing resource-status", DENY,
         update("default", ALICE, pod("default", annotations={STATUS: RS}), pod("default", annotations={}))),
        (KA, "a user's update keeping resource-status", ALLOW,
         update("default", ALICE, pod("default", annotations={STATUS: RS}), pod("default", labels={"x": "y"}, annotations={STATUS: RS}))),
        (KA, "the kubelet's status update keeping resource-status", ALLOW,
         update("default", KUBELET, pod("default", annotations={STATUS: RS}), pod("default", annotations={STATUS: RS}), "status")),
        (KA, "a status update adding resource-status", DENY,
         update("default", KUBELET, pod("default"), pod("default", annotations={STATUS: RS}), "status")),
        # --- node.koordinator.sh/extended-resource-spec ---
        (KA, "BE pod with batch resources and the webhook's spec", ALLOW,
         create("default", ALICE, pod("default", labels=BE, annotations={SPEC: ERS},
                                     containers=[batch({"kubernetes.io/batch-cpu": "1k"}, {"kubernetes.io/batch-cpu": "1k"})]))),
        (KA, "BE pod with only a batch-memory limit and a spec", ALLOW,
         create("default", ALICE, pod("default", labels=BE, annotations={SPEC: ERS},
                                     containers=[{"name": "side", "image": "x"}, batch(limits={"kubernetes.io/batch-memory": "1Gi"})]))),
        (KA, "a Deployment's BE pod with batch resources and the webhook's spec", ALLOW,
         create("default", RS_CONTROLLER, pod("default", labels=BE, annotations={SPEC: ERS},
                                             containers=[batch({"kubernetes.io/batch-cpu": "1k"})]))),
        (KA, "BE pod without batch resources, spec set by its author", DENY,
         create("default", ALICE, pod("default", labels=BE, annotations={SPEC: ERS})), ALICE),
        (KA, "BE pod with batch resources only in an init container, spec set", DENY,
         create("default", ALICE, pod("default", labels=BE, annotations={SPEC: ERS},
                                     init=[batch({"kubernetes.io/batch-cpu": "1k"}, name="init")]))),
        (KA, "pod without batch resources, spec {} (the webhook replaced its author's)", ALLOW,
         create("default", ALICE, pod("default", labels=BE, annotations={SPEC: "{}"}))),
        (KA, "a user's binding carrying the spec", DENY,
         create("default", ALICE, binding_obj("default", {SPEC: ERS}), "binding")),
        (KA, "a user adding the spec", DENY,
         update("default", ALICE, pod("default", labels=BE), pod("default", labels=BE, annotations={SPEC: ERS}))),
        (KA, "a user changing the spec", DENY,
         update("default", ALICE, pod("default", annotations={SPEC: ERS}), pod("default", annotations={SPEC: "{}"}))),
        (KA, "a user removing the spec (a BE pod would lose its limits)", DENY,
         update("default", ALICE, pod("default", annotations={SPEC: ERS, "a": "b"}), pod("default", annotations={"a": "b"}))),
        (KA, "a user's update keeping the spec", ALLOW,
         update("default", ALICE, pod("default", annotations={SPEC: ERS}), pod("default", labels={"x": "y"}, annotations={SPEC: ERS}))),
        (KA, "koord-manager changing the spec", ALLOW,
         update("default", KOORD_MANAGER, pod("default", annotations={SPEC: ERS}), pod("default", annotations={SPEC: "{}"}))),
    ]


def main():
    policies = load_policies()
    missing = {SL, KA} - set(policies)
    if missing:
        raise SystemExit(f"policies not found in deploy/: {sorted(missing)}")
    passed = failed = 0

    def report(ok, name, detail=""):
        nonlocal passed, failed
        print(f"{'ok   ' if ok else 'FAIL '} {name}" + (f"\n      {detail}" if detail and not ok else ""))
        passed, failed = passed + ok, failed + (not ok)

    # What the schema check (kubernetes-validate) does not see: enum values and the API server's
    # own validation of these fields.
    for pname, (policy, binding, path) in sorted(policies.items()):
        spec, actions = policy["spec"], binding["spec"].get("validationActions") or []
        problems = []
        if spec.get("failurePolicy") != "Fail":
            problems.append("failurePolicy is not Fail")
        if not actions or not set(actions) <= {"Deny", "Warn", "Audit"} or {"Deny", "Warn"} <= set(actions):
            problems.append(f"validationActions {actions}")
        for v in spec["validations"]:
            if "\n" in v.get("message", "") or v.get("reason", "Invalid") not in (
                "Unauthorized", "Forbidden", "Invalid", "RequestEntityTooLarge"):
                problems.append(f"message or reason of {v['expression'][:40]!r}")
        report(not problems, f"{os.path.basename(path)}: failurePolicy, validationActions, messages", "; ".join(problems))
        # CEL's reserved words are no field names for the API server's CEL (request.namespace fails to
        # compile before Kubernetes 1.32; namespaceObject.metadata.name does not), while cel-python
        # takes them.
        exprs = [c["expression"] for c in spec.get("matchConditions") or []] + \
            [v["expression"] for v in spec.get("variables") or []] + \
            [v[k] for v in spec["validations"] for k in ("expression", "messageExpression") if k in v]
        bad = [m.group(0) for e in exprs for m in RESERVED.finditer(e)]
        report(not bad, f"{os.path.basename(path)}: no CEL reserved word as a field name", ", ".join(bad))

    for case in cases():
        pname, name, want, (req, obj, old), *needle = case
        policy, binding, path = policies[pname]
        label = f"{os.path.basename(path)}: {name}: {'allowed' if want else 'refused'}"
        try:
            got, msg = admit(policy, binding, req, obj, old)
        except Exception as e:  # a CEL error: the policy is wrong for this request
            report(False, label, f"CEL error: {e!r}")
            continue
        ok = got == want and (want or not needle or needle[0] in msg)
        report(ok, label, f"got {'allowed' if got else 'refused'}: {msg}")

    # The harness itself: with every validation true, a refused case is allowed; without the
    # namespaceSelector, the skip label is refused in kube-system too.
    sl_policy, sl_binding, _ = policies[SL]
    lax = copy.deepcopy(sl_policy)
    for v in lax["spec"]["validations"]:
        v["expression"] = "true"
    unbound = copy.deepcopy(sl_binding)
    del unbound["spec"]["matchResources"]
    for name, policy, binding, ns, want in [
        ("harness: the validations decide (all true: allowed)", lax, sl_binding, "default", True),
        ("harness: the namespaceSelector decides (none: refused)", sl_policy, unbound, "kube-system", False),
    ]:
        try:
            report(admit(policy, binding, *create(ns, ALICE, pod(ns, labels=T)))[0] == want, name)
        except Exception as e:
            report(False, name, f"CEL error: {e!r}")

    print(f"\ntest-admission: {passed} passed; {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
