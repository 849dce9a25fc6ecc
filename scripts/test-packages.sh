#!/usr/bin/env bash
# test-packages.sh — the packages phase of `make test` (also on its own, as root on Debian 12): builds both
# .debs (scripts/package.sh deb), installs them on this machine and checks them, then purges them, leaving the
# machine as it was:
#
#   * dpkg -i of both; what landed where (dpkg -L), the conffiles, file modes; nothing enabled or started;
#   * the installed binaries' --help and --version (`runtime-proxy <version> (git <revision>)`);
#   * the man pages (man8: each program and its `status`) format without a groff warning, and `man -l` shows the
#     program's flags; the bash completion completes flags, values and the status subcommand's flags in bash, the zsh
#     and fish ones name the flags;
#   * systemd-analyze verify of both units (offline: systemd need not be PID 1), silent and exit 0; the
#     exposure score of `systemd-analyze security --offline` is printed;
#   * the installed /etc/runtime-hooks/rules.yaml is a rules file runtime-hooks starts with;
#   * deploy/*.yaml and deploy/crds/*.yaml against the Kubernetes OpenAPI schema (PyPI kubernetes-validate, pinned in
#     deploy/validate-requirements.txt, whose schemas ship in the package: run without a network), --strict;
#     a manifest with an unknown field must fail; the KubeletConfiguration snippet names the proxy's socket;
#     runtime-hooks' ClusterRole grants exactly the rights its cluster rule source needs, to the DaemonSet's
#     ServiceAccount; the CRDs define NodeSLO and NodeResourceTopology as runtime-hooks reads them;
#   * the Grafana dashboard (deploy/grafana-dashboard.json) ships unchanged in both packages and is JSON (that its
#     queries name only metrics the programs export is checked by `cargo test`: runtime-proxy's and runtime-hooks'
#     status::tests render their metrics and compare);
#   * the admission policies' CEL (deploy/*-policy.yaml) against sample admission requests, evaluated by PyPI
#     cel-python (pinned in the same file): scripts/test-admission.py, offline;
#   * RUNTIME_PROXY_ENABLE=yes / RUNTIME_HOOKS_ENABLE=yes at install enable the units (systemctl enable works
#     offline);
#   * dpkg --purge: every packaged path, the enablement links and the conffiles are gone; paths that existed
#     before the test (e.g. /etc/runtime) are still there.
#
# Prints `ok`/`FAIL` per check and a cargo-style `test result:` line that scripts/test.sh counts.
# Refuses to run when runtime-proxy or runtime-hooks is installed already (not ours to remove).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

TARGET=${CARGO_TARGET_DIR:-target}
OUT=$TARGET/dist/packages
VENV=$TARGET/kubernetes-validate
PKGS=(runtime-proxy runtime-hooks)
PASS=0 FAIL=0 BEFORE=$(mktemp) TMP=$(mktemp -d)

log() { echo "[test-packages.sh] $*" >&2; }
# check NAME CMD...: runs CMD; `ok NAME`, or `FAIL NAME` with CMD's output.
check() {
  local name=$1 out
  shift
  if out=$("$@" 2>&1); then
    echo "ok    $name" && PASS=$((PASS + 1))
  else
    echo "FAIL  $name" && sed 's/^/      /' <<<"$out" && FAIL=$((FAIL + 1))
  fi
}
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'ok installed'; }
purge_ours() { dpkg --purge "${PKGS[@]}" >/dev/null 2>&1 || true; }
cleanup() { purge_ours; rm -rf "$TMP" "$BEFORE" "$MARK"; }

# Installed by an earlier run of this script that did not finish (its marker is in /run): purge; else refuse.
MARK=/run/runtime-proxy-test-packages
for p in "${PKGS[@]}"; do
  if installed "$p"; then
    [ -e "$MARK" ] || { log "$p is installed on this machine already; not touching it"; exit 1; }
    log "purging what an unfinished earlier run installed" && purge_ours
  fi
done
need_pkgs dpkg-dev systemd python3 python3-venv util-linux procps binutils man-db groff-base bsdextrautils
bash scripts/package.sh deb || { log "building the packages failed"; echo "test result: FAILED. 0 passed; 1 failed;"; exit 1; }
VERSION=$(awk -F'"' '/^\[workspace.package\]/ {p = 1} p && /^version *=/ {print $2; exit}' Cargo.toml)
REVISION=${GIT_REVISION:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
# revision BIN: what BIN's --version names: REVISION, `-dirty` after it when BIN's sources have uncommitted changes
# (the build step's rule, crates/git_revision.rs: its crate's and its path dependencies' src, build.rs and
# Cargo.toml, the workspace's Cargo.toml, Cargo.lock and vendor/; no GIT_REVISION given)
revision() {
  local paths=(Cargo.toml Cargo.lock vendor) c
  for c in "$1" hook-api daemon-support nri-plugin; do paths+=("crates/$c/src" "crates/$c/build.rs" "crates/$c/Cargo.toml"); done
  if [ -z "${GIT_REVISION:-}" ] && [ -n "$(git --no-optional-locks status --porcelain --untracked-files=no -- "${paths[@]}" 2>/dev/null)" ]; then
    echo "$REVISION-dirty"
  else
    echo "$REVISION"
  fi
}
ARCH=$(dpkg --print-architecture)
DEBS=("$OUT/runtime-proxy_${VERSION}_$ARCH.deb" "$OUT/runtime-hooks_${VERSION}_$ARCH.deb")

# Every path the packages hold (and their parents), and which of them exist now: purge must restore this.
for deb in "${DEBS[@]}"; do dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|; s|/$||'; done | grep -v '^\.\?$' | sort -u |
  while read -r p; do
    if [ -d "$p" ] && [ ! -L "$p" ] && [ -z "$(ls -A "$p")" ]; then echo "present-dir $p"; elif [ -e "$p" ]; then echo "present $p"; else echo "absent $p"; fi
  done >"$BEFORE"
trap cleanup EXIT
trap 'exit 130' INT TERM
: >"$MARK"

echo "==> install"
check "dpkg -i both packages" dpkg -i "${DEBS[@]}"
check "both installed" bash -c 'for p in runtime-proxy runtime-hooks; do dpkg-query -W -f="\${Status} \${Version}\n" $p | grep -qx "install ok installed '"$VERSION"'" || exit 1; done'
expect_files() {  # PKG PATH...: each PATH is in `dpkg -L PKG` and exists
  local pkg=$1 list p
  shift
  list=$(dpkg -L "$pkg")
  for p in "$@"; do grep -qx "$p" <<<"$list" || { echo "$p not in dpkg -L $pkg"; return 1; }; [ -e "$p" ] || { echo "$p missing"; return 1; }; done
}
check "runtime-proxy files (dpkg -L)" expect_files runtime-proxy /usr/bin/runtime-proxy /lib/systemd/system/runtime-proxy.service \
  /etc/default/runtime-proxy /etc/runtime/hookserver.d /usr/share/doc/runtime-proxy/copyright \
  /usr/share/doc/runtime-proxy/changelog.gz /usr/share/doc/runtime-proxy/operations.md \
  /usr/share/doc/runtime-proxy/examples/runtime-proxy-docker.conf /usr/share/doc/runtime-proxy/examples/10-runtime-proxy.conf \
  /usr/share/doc/runtime-proxy/examples/kubelet-config.yaml /usr/share/doc/runtime-proxy/examples/grafana-dashboard.json
check "runtime-hooks files (dpkg -L)" expect_files runtime-hooks /usr/bin/runtime-hooks /lib/systemd/system/runtime-hooks.service \
  /etc/default/runtime-hooks /etc/runtime-hooks/rules.yaml /etc/runtime/hookserver.d /usr/share/doc/runtime-hooks/copyright \
  /usr/share/doc/runtime-hooks/operations.md /usr/share/doc/runtime-hooks/examples/deploy/runtime-hooks.yaml \
  /usr/share/doc/runtime-hooks/examples/deploy/Dockerfile /usr/share/doc/runtime-hooks/examples/deploy/namespace.yaml \
  /usr/share/doc/runtime-hooks/examples/deploy/runtime-hooks-rules.yaml \
  /usr/share/doc/runtime-hooks/examples/deploy/skip-label-policy.yaml \
  /usr/share/doc/runtime-hooks/examples/deploy/koordinator-annotations-policy.yaml \
  /usr/share/doc/runtime-hooks/examples/deploy/runtime-hooks-rbac.yaml \
  /usr/share/doc/runtime-hooks/examples/deploy/crds/nodeslo.yaml \
  /usr/share/doc/runtime-hooks/examples/deploy/crds/noderesourcetopology.yaml \
  /usr/share/doc/runtime-hooks/examples/deploy/grafana-dashboard.json
check "conffiles" bash -c '[ "$(dpkg-query -W -f="\${Conffiles}" runtime-proxy | awk "{print \$1}" | paste -sd" ")" = "/etc/default/runtime-proxy" ] &&
  [ "$(dpkg-query -W -f="\${Conffiles}" runtime-hooks | awk "{print \$1}" | sort | paste -sd" ")" = "/etc/default/runtime-hooks /etc/runtime-hooks/rules.yaml" ]'
check "modes and owners" bash -c 'for f in /usr/bin/runtime-proxy /usr/bin/runtime-hooks; do [ "$(stat -c "%a %U:%G" $f)" = "755 root:root" ] || { stat -c "%n %a %U:%G" $f; exit 1; }; done
  for f in /lib/systemd/system/runtime-*.service /etc/default/runtime-* /etc/runtime-hooks/rules.yaml; do [ "$(stat -c "%a %U:%G" $f)" = "644 root:root" ] || { stat -c "%n %a %U:%G" $f; exit 1; }; done'
check "binaries stripped" bash -c 'for f in /usr/bin/runtime-proxy /usr/bin/runtime-hooks; do file -L $f 2>/dev/null | grep -q "not stripped" && { echo "$f not stripped"; exit 1; }; [ -z "$(objdump -h $f | grep -E "\.debug_|\.symtab")" ] || { echo "$f has debug/symbol sections"; exit 1; }; done'
check "no unit enabled or started" bash -c '! ls /etc/systemd/system/*.wants/runtime-* 2>/dev/null && ! pgrep -f "^/usr/bin/runtime-(proxy|hooks)"'

echo "==> binaries"
check "runtime-proxy --version" bash -c "[ \"\$(/usr/bin/runtime-proxy --version)\" = 'runtime-proxy $VERSION (git $(revision runtime-proxy))' ] || /usr/bin/runtime-proxy --version"
check "runtime-hooks --version" bash -c "[ \"\$(/usr/bin/runtime-hooks --version)\" = 'runtime-hooks $VERSION (git $(revision runtime-hooks))' ] || /usr/bin/runtime-hooks --version"
check "runtime-proxy --help" bash -c '/usr/bin/runtime-proxy --help | grep -q -- --koord-runtimeproxy-endpoint'
check "runtime-hooks --help" bash -c '/usr/bin/runtime-hooks --help | grep -q -- --probe'

echo "==> man pages and shell completions"
# docs_files PKG: the man pages and completions PKG ships (crates/cli-docs, run by scripts/package.sh)
docs_files() {
  echo "/usr/share/man/man8/$1.8.gz /usr/share/man/man8/$1-status.8.gz /usr/share/bash-completion/completions/$1" \
    "/usr/share/zsh/vendor-completions/_$1 /usr/share/fish/vendor_completions.d/$1.fish"
}
# shellcheck disable=SC2046 # one path per word
check "runtime-proxy man pages and completions (dpkg -L)" expect_files runtime-proxy $(docs_files runtime-proxy)
# shellcheck disable=SC2046
check "runtime-hooks man pages and completions (dpkg -L)" expect_files runtime-hooks $(docs_files runtime-hooks)
# man_ok PAGE FLAG...: PAGE (gzipped or not) formats with groff's warnings on (-ww, after preconv as man does) and no
# warning, and the text `man -l` renders (no hyphenation) names each FLAG
man_ok() {
  local page=$1 text warnings
  shift
  warnings=$(zcat -f "$page" | preconv | groff -man -Tutf8 -ww -z 2>&1) && [ -z "$warnings" ] || { echo "$page: $warnings"; return 1; }
  text=$(MANWIDTH=100 man -l --nh --nj "$page" 2>&1 | col -b) || { echo "$text"; return 1; }
  for f in "$@"; do grep -qF -- "$f" <<<"$text" || { echo "$page: no $f in:"; head -n 30 <<<"$text"; return 1; }; done
}
check "man 8 runtime-proxy renders, names its flags" man_ok /usr/share/man/man8/runtime-proxy.8.gz \
  --remote-runtime-service-endpoint --koord-runtimeproxy-endpoint --required-hook-servers "SEE ALSO" "runtime-proxy-status(8)"
check "man 8 runtime-hooks renders, names its flags" man_ok /usr/share/man/man8/runtime-hooks.8.gz --runtime-endpoint --rules --probe NODE_NAME
check "man 8 runtime-proxy-status / runtime-hooks-status render" bash -c "$(declare -f man_ok)
  man_ok /usr/share/man/man8/runtime-proxy-status.8.gz --timeout --output && man_ok /usr/share/man/man8/runtime-hooks-status.8.gz --timeout --output"
check "a page with an undefined request fails the same check" bash -c "$(declare -f man_ok)
  { zcat /usr/share/man/man8/runtime-hooks.8.gz && echo .xyzzy; } >$TMP/broken.8 && ! man_ok $TMP/broken.8 --probe >/dev/null"
# complete PROGRAM WORD...: what bash completes for the command line `PROGRAM WORD...` with the installed completion
complete_bash() {
  local prog=$1
  shift
  bash -c 'source "/usr/share/bash-completion/completions/$1"; fn=$(complete -p "$1" | sed -n "s/.*-F \([^ ]*\).*/\1/p")
    COMP_WORDS=("${@:1}"); COMP_CWORD=$(($# - 1)); COMP_LINE="${*:1}"; COMP_POINT=${#COMP_LINE}
    "$fn" "$1" "${!#}" "${@:$(($# - 1)):1}" 2>/dev/null; printf "%s\n" "${COMPREPLY[@]}"' _ "$prog" "$@"
}
check "bash: runtime-proxy --remote-runtime-s<TAB> completes the flag" bash -c "$(declare -f complete_bash)
  out=\$(complete_bash runtime-proxy --remote-runtime-s); [ \"\$out\" = --remote-runtime-service-endpoint ] || { echo \"\$out\"; exit 1; }"
check "bash: runtime-hooks --mode <TAB> offers the modes, status --out<TAB> --output" bash -c "$(declare -f complete_bash)
  [ \"\$(complete_bash runtime-hooks --mode '' | sort | paste -sd' ')\" = 'nri proxy standalone' ] &&
  complete_bash runtime-hooks status --out | grep -qx -- --output"
check "zsh and fish completions name the flags" bash -c 'grep -q -- "--remote-runtime-service-endpoint" /usr/share/zsh/vendor-completions/_runtime-proxy &&
  grep -q -- "-l remote-runtime-service-endpoint" /usr/share/fish/vendor_completions.d/runtime-proxy.fish &&
  grep -q -- "--runtime-endpoint" /usr/share/zsh/vendor-completions/_runtime-hooks &&
  grep -q -- "-l runtime-endpoint" /usr/share/fish/vendor_completions.d/runtime-hooks.fish'
# The flags in /etc/default/* are accepted: ExecStart as systemd expands it, plus --help (clap parses first).
flags_ok() {  # BIN VAR FILE
  local bin=$1 var=$2
  (set -a && . "$3" && set +a && eval "set -- \$$var" && "$bin" "$@" --help >/dev/null)
}
check "/etc/default/runtime-proxy flags parse" flags_ok /usr/bin/runtime-proxy RUNTIME_PROXY_OPTS /etc/default/runtime-proxy
check "/etc/default/runtime-hooks flags parse" flags_ok /usr/bin/runtime-hooks RUNTIME_HOOKS_OPTS /etc/default/runtime-hooks
# A reconcile pass at start corrects the pods created while runtime-hooks was down: it needs the runtime's socket.
check "/etc/default/runtime-hooks: proxy mode with --runtime-endpoint" bash -c '. /etc/default/runtime-hooks && case " $RUNTIME_HOOKS_OPTS " in *" --mode proxy "*" --runtime-endpoint /var/run/containerd/containerd.sock "*) ;; *) echo "$RUNTIME_HOOKS_OPTS"; exit 1;; esac'

echo "==> systemd units"
verify() { local out; out=$(systemd-analyze verify "$@" 2>&1) || { echo "$out"; return 1; }; [ -z "$out" ] || { echo "$out"; return 1; }; }
check "systemd-analyze verify runtime-proxy.service" verify /lib/systemd/system/runtime-proxy.service
check "systemd-analyze verify runtime-hooks.service" verify /lib/systemd/system/runtime-hooks.service
refuses_broken() {  # the same check fails for a unit with a misspelt key (systemd-analyze only warns, exit 0)
  sed 's/^ProtectHome=/ProtectHomee=/' /lib/systemd/system/runtime-proxy.service >"$TMP/broken.service"
  ! verify "$TMP/broken.service" >/dev/null
}
check "a unit with an unknown key fails the same check" refuses_broken
for u in runtime-proxy runtime-hooks; do
  echo "      $u.service: $(systemd-analyze security --offline=yes /lib/systemd/system/$u.service 2>/dev/null | grep -o 'Overall exposure level.*' || echo 'no security score')"
done
check "Type=notify, EnvironmentFile, Before=kubelet" bash -c 'for u in runtime-proxy runtime-hooks; do f=/lib/systemd/system/$u.service; grep -qx Type=notify $f && grep -qx "EnvironmentFile=-/etc/default/$u" $f && grep -q "^Before=kubelet.service" $f || { echo $u; exit 1; }; done
  grep -q "^After=.*containerd.service" /lib/systemd/system/runtime-proxy.service'
check "LimitNOFILE=1048576 (not systemd's soft 1024)" bash -c 'for u in runtime-proxy runtime-hooks; do grep -qx LimitNOFILE=1048576 /lib/systemd/system/$u.service || { echo $u; exit 1; }; done'
check "TimeoutStopSec above the default --drain-timeout" bash -c 't=$(sed -n "s/^TimeoutStopSec=\([0-9]*\)s$/\1/p" /lib/systemd/system/runtime-proxy.service); d=$(grep -o -- "--drain-timeout [0-9]*s" /etc/default/runtime-proxy | grep -o "[0-9]*"); [ "$t" -gt "$d" ]'

echo "==> configuration"
rules_ok() {  # runtime-hooks starts with the installed rules file (exit 2 on an invalid one), serves, stops
  local d=$TMP/rules pid
  mkdir -p "$d/hooks" "$d/cgroup"
  /usr/bin/runtime-hooks --rules /etc/runtime-hooks/rules.yaml --listen "$d/h.sock" --hook-config-dir "$d/hooks" \
    --cgroup-root "$d/cgroup" --cgroup-version v1 --unchecked-cgroup-root --cgroup-driver cgroupfs >"$d/log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do /usr/bin/runtime-hooks --probe --listen "$d/h.sock" 2>/dev/null && break; sleep 0.1; done
  /usr/bin/runtime-hooks --probe --listen "$d/h.sock" || { cat "$d/log"; kill "$pid"; return 1; }
  kill -TERM "$pid" && wait "$pid" && grep -q 'rules=/etc/runtime-hooks/rules.yaml' "$d/log" || { cat "$d/log"; return 1; }
}
check "installed rules.yaml accepted by runtime-hooks" rules_ok

echo "==> Grafana dashboard"
dashboard_ok() {
  local f
  for f in /usr/share/doc/runtime-proxy/examples/grafana-dashboard.json /usr/share/doc/runtime-hooks/examples/deploy/grafana-dashboard.json; do
    cmp deploy/grafana-dashboard.json "$f" || return 1
  done
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["panels"] and d["uid"], "no panels"' deploy/grafana-dashboard.json
}
check "grafana-dashboard.json: JSON, shipped unchanged in both packages" dashboard_ok
check "a dashboard that is not JSON fails the same check" bash -c "head -c 200 deploy/grafana-dashboard.json >$TMP/cut.json && ! python3 -c 'import json, sys; json.load(open(sys.argv[1]))' $TMP/cut.json 2>/dev/null"

echo "==> Kubernetes manifests"
validator() {
  if [ ! -x "$VENV/bin/kubernetes-validate" ] || ! cmp -s deploy/validate-requirements.txt "$VENV/requirements.txt"; then
    rm -rf "$VENV" && python3 -m venv "$VENV" && "$VENV/bin/pip" install -q -r deploy/validate-requirements.txt &&
      cp deploy/validate-requirements.txt "$VENV/requirements.txt"
  fi
}
check "kubernetes-validate installed (PyPI, pinned)" validator
# unshare -n: a network namespace with no interfaces, so the schemas can only come from the package.
kv() { unshare -n "$VENV/bin/kubernetes-validate" --strict "$@"; }
for f in deploy/*.yaml deploy/crds/*.yaml; do check "valid: $f (offline, --strict)" kv "$f"; done
check "invalid manifest refused" bash -c "sed 's/^\(  *\)terminationGracePeriodSeconds:/\1terminationGracePeriodSecond:/' deploy/runtime-hooks.yaml >$TMP/bad.yaml && grep -q terminationGracePeriodSecond: $TMP/bad.yaml && ! unshare -n $VENV/bin/kubernetes-validate --strict $TMP/bad.yaml"
# The policies' CEL, evaluated as the API server would for each sample request (allowed or refused).
check "admission policies: CEL against sample requests (cel-python, offline)" unshare -n "$VENV/bin/python" scripts/test-admission.py
check "DaemonSet: skip label, probe, mounts (the cgroup root read-write, the runtime socket, systemd's bus)" "$VENV/bin/python" - <<'PY'
import yaml
ds = yaml.safe_load(open("deploy/runtime-hooks.yaml"))
t = ds["spec"]["template"]
assert t["metadata"]["labels"]["runtimeproxy.koordinator.sh/skip-hookserver"] == "true"
c = t["spec"]["containers"][0]
assert c["livenessProbe"]["exec"]["command"][:2] == ["/usr/bin/runtime-hooks", "--probe"]
assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in c["env"]
paths = {v["hostPath"]["path"] for v in t["spec"]["volumes"] if "hostPath" in v}
assert paths == {"/sys/fs/cgroup", "/etc/runtime/hookserver.d", "/var/run/runtime-hooks", "/var/run/containerd", "/run/dbus"}, paths
mounts = {m["mountPath"] for m in c["volumeMounts"]}
assert {"/etc/runtime/hookserver.d", "/var/run/runtime-hooks"} <= mounts, "the proxy dials the registered path: same paths as the host"
assert "--cgroup-root=/host/sys/fs/cgroup" in c["args"] and "/host/sys/fs/cgroup" in mounts
# the reconciler lists pods from the runtime's socket (rule changes reach running pods in proxy mode)
assert "--runtime-endpoint=/var/run/containerd/containerd.sock" in c["args"] and "/var/run/containerd" in mounts
cgroup = next(m for m in c["volumeMounts"] if m["mountPath"] == "/host/sys/fs/cgroup")
assert not cgroup.get("readOnly"), "runtime-hooks writes the host's cgroup files: its start-up check refuses a read-only root"
# the systemd driver: values are set as the pod slices' unit properties over the host's system bus
assert "/run/dbus" in mounts, "systemd's bus socket, /run/dbus/system_bus_socket, at its host path"
PY
# rbac_ok FILE: FILE (runtime-hooks-rbac.yaml or a variant) grants exactly what runtime-hooks' cluster rule source
# needs, to the ServiceAccount the DaemonSet runs as.
rbac_ok() {
  "$VENV/bin/python" - "$1" <<'PY'
import sys, yaml
docs = {d["kind"]: d for d in yaml.safe_load_all(open(sys.argv[1]))}
assert sorted(docs) == ["ClusterRole", "ClusterRoleBinding", "ServiceAccount"], sorted(docs)
sa, role, binding = docs["ServiceAccount"], docs["ClusterRole"], docs["ClusterRoleBinding"]
# Every (API group, resource, verb) the rules grant, and no wildcard, resourceNames or nonResourceURLs.
granted = set()
for r in role["rules"]:
    assert set(r) == {"apiGroups", "resources", "verbs"}, r
    for x in r["apiGroups"] + r["resources"] + r["verbs"]:
        assert "*" not in x, r
    granted |= {(g, res, v) for g in r["apiGroups"] for res in r["resources"] for v in r["verbs"]}
read = {"get", "list", "watch"}
want = {(g, res, v) for g, res in [("", "nodes"), ("", "pods"), ("slo.koordinator.sh", "nodeslos"),
                                   ("topology.node.k8s.io", "noderesourcetopologies")] for v in read}
want |= {("", "events", v) for v in ("create", "patch")}
assert granted == want, ("granted but not needed", sorted(granted - want), "needed but not granted", sorted(want - granted))
assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]}, binding["roleRef"]
assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": sa["metadata"]["namespace"]}], binding["subjects"]
ds = yaml.safe_load(open("deploy/runtime-hooks.yaml"))
assert ds["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"], "the DaemonSet runs as another service account"
assert ds["metadata"]["namespace"] == sa["metadata"]["namespace"] == yaml.safe_load(open("deploy/namespace.yaml"))["metadata"]["name"]
PY
}
check "RBAC: exactly the rights the cluster rule source needs, bound to the DaemonSet's ServiceAccount" rbac_ok deploy/runtime-hooks-rbac.yaml
# The same check fails for a ClusterRole granting one resource more, one verb more, or one verb less.
rbac_variants_refused() {
  local v n=0
  for v in 's/"nodes", "pods"\]/"nodes", "pods", "secrets"]/' 's/\["create", "patch"\]/["create", "patch", "update"]/' \
           's/\["create", "patch"\]/["create"]/'; do
    sed "$v" deploy/runtime-hooks-rbac.yaml >"$TMP/rbac-$n.yaml"
    ! cmp -s deploy/runtime-hooks-rbac.yaml "$TMP/rbac-$n.yaml" || { echo "sed '$v' changed nothing"; return 1; }
    ! rbac_ok "$TMP/rbac-$n.yaml" >/dev/null 2>&1 || { echo "accepted: sed '$v'"; return 1; }
    n=$((n + 1))
  done
}
check "RBAC check refuses a role granting more or less" rbac_variants_refused
check "CRDs: NodeSLO and NodeResourceTopology as runtime-hooks reads them" "$VENV/bin/python" - <<'PY'
import yaml
def crd(path, group, plural, kind):
    c = yaml.safe_load(open(path))
    s = c["spec"]
    assert c["metadata"]["name"] == f"{plural}.{group}" and s["group"] == group, c["metadata"]["name"]
    assert s["names"]["plural"] == plural and s["names"]["kind"] == kind and s["scope"] == "Cluster", s["names"]
    assert [(v["name"], v["served"], v["storage"]) for v in s["versions"]] == [("v1alpha1", True, True)], s["versions"]
    return c, s["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
_, p = crd("deploy/crds/nodeslo.yaml", "slo.koordinator.sh", "nodeslos", "NodeSLO")
assert p["spec"]["x-kubernetes-preserve-unknown-fields"] and p["status"]["x-kubernetes-preserve-unknown-fields"]
c, p = crd("deploy/crds/noderesourcetopology.yaml", "topology.node.k8s.io", "noderesourcetopologies", "NodeResourceTopology")
# A group ending in .k8s.io: the API server refuses the CRD without this annotation.
assert c["metadata"]["annotations"]["api-approved.kubernetes.io"].startswith("https://github.com/kubernetes/enhancements/pull/")
assert p["topologyPolicies"]["items"]["type"] == "string"
assert p["zones"]["items"]["x-kubernetes-preserve-unknown-fields"] and p["attributes"]["items"]["x-kubernetes-preserve-unknown-fields"]
PY
check "KubeletConfiguration snippet names the proxy's default socket" "$VENV/bin/python" - <<'PY'
import yaml
k = yaml.safe_load(open("deploy/kubelet/kubelet-config.yaml"))
assert k["apiVersion"] == "kubelet.config.k8s.io/v1beta1" and k["kind"] == "KubeletConfiguration"
assert k["containerRuntimeEndpoint"] == "unix:///var/run/koord-runtimeproxy/runtimeproxy.sock"
assert "--koord-runtimeproxy-endpoint /var/run/koord-runtimeproxy/runtimeproxy.sock" in open("packaging/default/runtime-proxy").read()
PY
check "ConfigMap rules = the packaged rules.yaml" bash -c "'$VENV/bin/python' -c 'import sys, yaml; sys.stdout.write(yaml.safe_load(open(\"deploy/runtime-hooks-rules.yaml\"))[\"data\"][\"rules.yaml\"])' >$TMP/cm-rules.yaml &&
  cmp <(grep -v '^#' packaging/examples/rules.yaml) $TMP/cm-rules.yaml"

echo "==> enable at install (RUNTIME_PROXY_ENABLE=yes, RUNTIME_HOOKS_ENABLE=yes)"
check "dpkg --purge, then install with the enable variables" bash -c "dpkg --purge runtime-proxy runtime-hooks >/dev/null && RUNTIME_PROXY_ENABLE=yes RUNTIME_HOOKS_ENABLE=yes dpkg -i ${DEBS[*]} >/dev/null"
check "both units enabled (multi-user.target.wants)" bash -c '[ -L /etc/systemd/system/multi-user.target.wants/runtime-proxy.service ] && [ -L /etc/systemd/system/multi-user.target.wants/runtime-hooks.service ]'

echo "==> purge"
check "dpkg --purge both" dpkg --purge "${PKGS[@]}"
check "nothing installed" bash -c '! dpkg-query -W -f="\${Status}\n" runtime-proxy runtime-hooks 2>/dev/null | grep -q installed'
# dpkg removes a package's empty directories at purge even when they existed before the install (it does not
# record that): put back those that were there, as they were (empty, so nothing else is lost), and say so.
restore_dirs() {
  local state p
  while read -r state p; do
    [ "$state" = present-dir ] && [ ! -e "$p" ] && mkdir -p "$p" && echo "      (dpkg removed the empty $p that existed before the install; recreated)"
  done <"$BEFORE"
  true
}
restore_dirs
check "machine as before (packaged paths, conffiles, enablement links)" bash -c "
  while read -r state p; do
    if [ \$state = absent ] && [ -e \$p ]; then echo \"\$p left behind\"; bad=1; fi
    if [ \$state != absent ] && [ ! -e \$p ]; then echo \"\$p was there before and is gone\"; bad=1; fi
  done <$BEFORE
  ls /etc/systemd/system/*.wants/runtime-* 2>/dev/null && bad=1
  exit \${bad:-0}"

echo
echo "test result: $([ $FAIL -eq 0 ] && echo ok || echo FAILED). $PASS passed; $FAIL failed;"
[ $FAIL -eq 0 ]
