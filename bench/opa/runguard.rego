# runguard's validating rules for a Pod CREATE, in Rego, for bench/bench_opa.py: the same
# rules served by OPA (the engine behind Gatekeeper) as an admission webhook, to compare
# runguard's /validate against it. Not a second implementation to ship: a benchmark peer.
#
# The policy's values (selectors, profiles, maximums, levels, name patterns, identities)
# are not written here: bench_opa.py generates data.runguard_data.policies from the runguard
# policy directory (webhook.policy loader), one entry per RunPolicy in the order runguard
# tries them. What is written here are the rules and the Pod Security Standards'
# constants (as webhook/engine/rules/pod_security.py has them).
#
# What runguard's /validate does at CREATE that OPA mirrors (rule ids, docs/rules.md):
#   profile.unknown, profile.applied (profile values in the main container, nodeSelector,
#     env, tolerations, affinity, priorityClassName, runtimeClassName),
#   resources.exceeded (per container and the run's total as the scheduler counts it:
#     containers + sidecars, init peaks, pod-level resources), resources.gpu-mismatch,
#   resources.defaults, resources.memory-limit, resources.clamped (request above limit),
#   resources.device-env,
#   security.root, security.defaults, security.privileged, security.capabilities,
#   security.seccomp, security.host-namespace, security.host-ports, security.sysctls,
#   security.selinux, security.apparmor, security.proc-mount, security.probe-host,
#   volumes.forbidden-type (policy list and the level's), volumes.pre-existing (claims,
#     configMaps, projected configMaps, claim templates bringing data),
#   secrets.forbidden (env, envFrom, secret volumes, projected, imagePullSecrets),
#   scheduling.priority-class, scheduling.preemption-mode (an unknown stated mode only),
#   ownership.not-a-run, ownership.unknown (a controller's pod with no cluster state),
#   enforcement Deny / Warn / Audit, excluded namespaces, several RunPolicies.
# What it does not:
#   UPDATE (scope.labels, ownership.stamp, update.spec-kept, violations already present
#     becoming warnings): OPA here allows every operation but CREATE;
#   pod controllers (Job, Deployment...: judged after mutation by runguard): allowed here;
#   ownership through controllers found by uid in the cluster state (no state here),
#     project-shared claims (idem), cluster_lacks of priority/runtime classes;
#   scheduling.preemption-mode "not applied" (MLRun's enrichment), ownership.reserved-name
#     (PVC, Secret, ConfigMap objects), input.invalid (the shape check), engine.error;
#   the exact texts and the order of runguard's messages.
# Like runguard, validation is a backstop of mutation: a Pod that runguard's mutating
# webhook would still change (profile, defaults, hardening) is denied.
package runguard

# --- the request ------------------------------------------------------------------------

m(x) := x if {
	is_object(x)
} else := {}

a(x) := x if {
	is_array(x)
} else := []

req := input.request

obj := m(req.object)

meta := m(object.get(obj, "metadata", {}))

labels := m(object.get(meta, "labels", {}))

annotations := m(object.get(meta, "annotations", {}))

spec := m(object.get(obj, "spec", {}))

namespace := n if {
	n := req.namespace
	is_string(n)
	n != ""
} else := n if {
	n := meta.namespace
	is_string(n)
} else := ""

judged if {
	req.operation == "CREATE"
	obj.kind == "Pod"
}

requester := u if {
	u := req.userInfo.username
	is_string(u)
	u != ""
}

groups := a(object.get(m(object.get(req, "userInfo", {})), "groups", []))

# --- which RunPolicy --------------------------------------------------------------------

policies := data.runguard_data.policies

governing := [p |
	some p in policies
	not namespace in p.excludeNamespaces
	selects(p.selector)
]

policy := governing[0]

is_run if count(governing) > 0

selects(sel) if {
	every k, v in sel.matchLabels {
		labels[k] == v
	}
	every e in sel.matchExpressions {
		requirement(e)
	}
}

requirement(e) if {
	e.operator == "Exists"
	_ = labels[e.key]
}

requirement(e) if {
	e.operator == "DoesNotExist"
	not labels[e.key]
}

requirement(e) if {
	e.operator == "In"
	labels[e.key] in e.values
}

requirement(e) if {
	e.operator == "NotIn"
	not labels[e.key] in e.values
}

# --- ownership (docs/dev/guarantees.md, "Ownership") --------------------------

identity(p) if {
	some i in p.platform.identities
	not startswith(i, "group:")
	i == requester
}

identity(p) if {
	some i in p.platform.identities
	startswith(i, "group:")
	substring(i, 6, -1) in groups
}

owned(p) if count(p.platform.identities) == 0

owned(p) if identity(p)

owner_kinds := {"Job", "CronJob", "ReplicaSet", "Deployment", "StatefulSet", "DaemonSet", "ReplicationController"}

# A controller's pod: its owner is found by uid in the cluster state, which this peer has
# not (runguard without one says the same: unknown).
ownership_unknown(p) if {
	count(p.platform.identities) > 0
	requester in p.platform.controllers
	some ref in a(object.get(meta, "ownerReferences", []))
	ref.controller == true
	ref.kind in owner_kinds
	is_string(ref.uid)
}

# --- name patterns: "*" and {labels[KEY]} (webhook/policy/patterns.py) -------------------

named(pattern, name) if {
	values := [v |
		some k in pattern.keys
		v := object.get(labels, k, "")
		is_string(v)
		v != ""
	]
	count(values) == count(pattern.keys)
	parts := [concat("", [replace(v, ".", `\.`), pattern.literals[i + 1]]) | some i, v in values]
	regex.match(concat("", ["^", pattern.literals[0], concat("", parts), "$"]), name)
}

named_any(patterns, name) if {
	some pattern in patterns
	named(pattern, name)
}

# --- containers ----------------------------------------------------------------------------

entries(lists) := [{"list": ln, "i": i, "c": c} |
	some ln in lists
	some i, c in a(object.get(spec, ln, []))
]

containers := entries(["initContainers", "containers"])

all_containers := entries(["initContainers", "containers", "ephemeralContainers"])

inits := a(object.get(spec, "initContainers", []))

sc(c) := m(object.get(c, "securityContext", {}))

psc := m(object.get(spec, "securityContext", {}))

res(c, part) := m(object.get(m(object.get(c, "resources", {})), part, {}))

qty(x) := units.parse(x) if {
	is_string(x)
} else := x

same_qty(x, y) if {
	x != null
	qty(x) == qty(y)
}

cpath(e) := sprintf("spec.%s[%d]", [e.list, e.i])

windows if spec.os.name == "windows"

linux if not windows

restricted if policy.security.level == "restricted"

viol(rule, path, msg) := {"rule": rule, "path": path, "msg": msg}

# --- profile.* ------------------------------------------------------------------------------

asked := n if {
	n := labels[policy.profiles.label]
	n != ""
} else := n if {
	n := annotations[policy.profiles.label]
	n != ""
} else := policy.profiles.default

profile := p if {
	p := policy.profiles.byName[asked]
} else := p if {
	asked != null
	policy.profiles.unknown == "Default"
	p := object.get(policy.profiles.byName, [policy.profiles.default], null)
	p != null
}

check_violation contains viol("profile.unknown", sprintf("metadata.labels[%s]", [policy.profiles.label]), sprintf("profile %q does not exist", [asked])) if {
	asked != null
	not policy.profiles.byName[asked]
	policy.profiles.unknown == "Deny"
}

main_index := i if {
	wanted := annotations["runguard.io/main-container"]
	found := [j | some j, c in a(spec.containers); c.name == wanted]
	i := found[0]
} else := 0

main := spec.containers[main_index]

not_applied contains sprintf("%s %s", [part, r]) if {
	some part in ["requests", "limits"]
	some r, want in profile.resources[part]
	not same_qty(object.get(res(main, part), r, null), want)
}

not_applied contains sprintf("nodeSelector %s", [k]) if {
	some k, want in profile.nodeSelector
	object.get(m(object.get(spec, "nodeSelector", {})), k, null) != want
}

not_applied contains sprintf("env %s", [var.name]) if {
	some var in profile.env
	not profile_env(var)
}

profile_env(var) if {
	found := [e | some e in a(object.get(main, "env", [])); e.name == var.name]
	found[0] == var
}

not_applied contains "tolerations" if {
	some t in profile.tolerations
	same := [u |
		some u in a(object.get(spec, "tolerations", []))
		object.get(u, "key", null) == object.get(t, "key", null)
		object.get(u, "effect", null) == object.get(t, "effect", null)
	]
	same != [t]
}

not_applied contains k if {
	some k in ["affinity", "priorityClassName", "runtimeClassName"]
	want := profile[k]
	want != null
	object.get(spec, k, null) != want
}

unapplied contains viol("profile.applied", "spec", sprintf("not applied: profile %s: %s", [profile.name, concat(", ", not_applied)])) if {
	count(not_applied) > 0
}

# --- resources.* ----------------------------------------------------------------------------

check_violation contains viol("resources.exceeded", sprintf("%s.resources.%s.%s", [cpath(e), part, r]), sprintf("%v is above the maximum %v", [value, maximum])) if {
	some e in containers
	some part in ["requests", "limits"]
	some r, value in res(e.c, part)
	maximum := policy.resources.maximums[r]
	qty(value) > maximum
}

check_violation contains viol("resources.gpu-mismatch", sprintf("%s.resources.requests.%s", [cpath(e), policy.resources.gpu]), "gpu request must equal gpu limit") if {
	some e in containers
	gpu_named(e.c)
	not gpu_equal(e.c)
}

gpu_named(c) if _ = res(c, "requests")[policy.resources.gpu]

gpu_named(c) if _ = res(c, "limits")[policy.resources.gpu]

gpu_equal(c) if qty(res(c, "requests")[policy.resources.gpu]) == qty(res(c, "limits")[policy.resources.gpu])

unapplied contains viol("resources.defaults", sprintf("%s.resources.%s.%s", [cpath(e), part, r]), "not applied: default missing") if {
	some part in ["requests", "limits"]
	some r, _ in policy.resources.defaults[part]
	some e in containers
	not res(e.c, part)[r]
}

unapplied contains viol("resources.memory-limit", sprintf("%s.resources.limits.memory", [cpath(e)]), "not applied: a memory request without a limit") if {
	policy.resources.memoryLimitFactor != null
	some e in containers
	_ = res(e.c, "requests").memory
	not res(e.c, "limits").memory
}

unapplied contains viol("resources.clamped", sprintf("%s.resources.requests.%s", [cpath(e), r]), "not applied: request above limit") if {
	some e in containers
	limits := res(e.c, "limits")
	some r, value in res(e.c, "requests")
	qty(value) > qty(limits[r])
}

sidecar(c) if c.restartPolicy == "Always"

part_values(holders, part, r) := [qty(x) | some c in holders; x := res(c, part)[r]]

regular_total(part, r) := sum(part_values(a(object.get(spec, "containers", [])), part, r)) + sum([qty(x) | some c in inits; sidecar(c); x := res(c, part)[r]])

sidecars_before(part, r, i) := sum([qty(y) | some j, s in inits; j < i; sidecar(s); y := res(s, part)[r]])

init_amounts(part, r) := [amount | some i, c in inits; not sidecar(c); x := res(c, part)[r]; amount := qty(x) + sidecars_before(part, r, i)]

init_peak(part, r) := max(array.concat([0], init_amounts(part, r)))

run_total(part, r) := qty(res(spec, part)[r]) if {
	_ = res(spec, part)[r]
} else := max([regular_total(part, r), init_peak(part, r)])

# One container holding it all is the per-container check's (as runguard skips it too).
shared_run if count(object.get(spec, "containers", [])) + count(inits) > 1

shared_run if spec.resources

check_violation contains viol("resources.exceeded", sprintf("spec.resources.%s.%s", [part, r]), sprintf("the run's total %v is above the maximum %v for one run", [total, maximum])) if {
	shared_run
	some part in ["requests", "limits"]
	some r, maximum in policy.resources.maximums
	total := run_total(part, r)
	total > maximum
}

check_violation contains viol("resources.device-env", sprintf("%s.env[%d]", [cpath(e), j]), sprintf("%s selects the node's devices outside the pod's requests", [env.name])) if {
	some e in all_containers
	some j, env in a(object.get(e.c, "env", []))
	env.name in policy.resources.deviceEnv
	not profile_device_env(e, env)
}

profile_device_env(e, env) if {
	e.list == "containers"
	e.i == main_index
	env in profile.env
}

# --- security.* (check_security, and what strip_root would still fill) ---------------------

confined := {"RuntimeDefault", "Localhost"}

security_violation contains viol("security.root", sprintf("spec.securityContext.%s", [k]), sprintf("%s 0 is root", [k])) if {
	some k in ["runAsUser", "runAsGroup", "fsGroup"]
	psc[k] == 0
}

security_violation contains viol("security.root", "spec.securityContext.supplementalGroups", "group 0 is root's") if {
	0 in a(object.get(psc, "supplementalGroups", []))
}

security_violation contains viol("security.root", "spec.securityContext.runAsNonRoot", "must not be false") if {
	psc.runAsNonRoot == false
}

security_violation contains viol("security.seccomp", "spec.securityContext.seccompProfile.type", "seccomp profile not allowed") if {
	profile_type := m(psc.seccompProfile).type
	not profile_type in confined
}

security_violation contains viol("security.seccomp", "spec.securityContext.seccompProfile.type", "seccomp profile not allowed") if {
	is_object(psc.seccompProfile)
	not psc.seccompProfile.type
}

security_violation contains viol("security.host-namespace", sprintf("spec.%s", [k]), sprintf("%s shares the node's namespace", [k])) if {
	some k in ["hostNetwork", "hostPID", "hostIPC"]
	spec[k] == true
}

pod_non_root if psc.runAsNonRoot == true

pod_seccomp_ok if psc.seccompProfile.type in confined

security_violation contains viol("security.root", sprintf("%s.securityContext.%s", [cpath(e), k]), sprintf("%s 0 is root", [k])) if {
	some e in all_containers
	some k in ["runAsUser", "runAsGroup"]
	sc(e.c)[k] == 0
}

security_violation contains viol("security.root", sprintf("%s.securityContext.runAsNonRoot", [cpath(e)]), "must not be false") if {
	some e in all_containers
	sc(e.c).runAsNonRoot == false
}

security_violation contains viol("security.root", sprintf("%s.securityContext.runAsNonRoot", [cpath(e)]), "must be true, here or in the pod's securityContext") if {
	restricted
	not pod_non_root
	some e in all_containers
	object.get(sc(e.c), "runAsNonRoot", null) == null
}

security_violation contains viol("security.privileged", sprintf("%s.securityContext.%s", [cpath(e), k]), sprintf("%s: true is not allowed", [k])) if {
	some e in all_containers
	some k in ["privileged", "allowPrivilegeEscalation"]
	sc(e.c)[k] == true
}

security_violation contains viol("security.privileged", sprintf("%s.securityContext.allowPrivilegeEscalation", [cpath(e)]), "must be set to false") if {
	restricted
	linux
	some e in all_containers
	object.get(sc(e.c), "allowPrivilegeEscalation", null) == null
}

added(c) := [cap |
	some cap in a(object.get(m(object.get(sc(c), "capabilities", {})), "add", []))
	not cap in policy.security.allowedCapabilities
]

security_violation contains viol("security.capabilities", sprintf("%s.securityContext.capabilities.add", [cpath(e)]), sprintf("capabilities %v are not allowed", [added(e.c)])) if {
	some e in all_containers
	count(added(e.c)) > 0
}

security_violation contains viol("security.capabilities", sprintf("%s.securityContext.capabilities.drop", [cpath(e)]), "must include ALL") if {
	restricted
	linux
	some e in all_containers
	not "ALL" in a(object.get(m(object.get(sc(e.c), "capabilities", {})), "drop", []))
}

security_violation contains viol("security.seccomp", sprintf("%s.securityContext.seccompProfile.type", [cpath(e)]), "seccomp profile not allowed") if {
	some e in all_containers
	seccomp := sc(e.c).seccompProfile
	seccomp != null
	not object.get(m(seccomp), "type", null) in confined
}

security_violation contains viol("security.seccomp", sprintf("%s.securityContext.seccompProfile", [cpath(e)]), "no seccomp profile") if {
	restricted
	linux
	not pod_seccomp_ok
	some e in all_containers
	object.get(sc(e.c), "seccompProfile", null) == null
}

# onRoot Allow (a build at baseline): root is left as written
check_violation contains x if {
	some x in security_violation
	not root_allowed(x)
}

root_allowed(x) if {
	policy.security.onRoot == "Allow"
	x.rule == "security.root"
}

# What strip_root would still fill (security.defaults): a Pod that bypassed /mutate.
unhardened contains "pod runAsNonRoot" if {
	policy.security.onRoot != "Allow"
	object.get(psc, "runAsNonRoot", null) == null
}

unhardened contains "pod seccomp" if {
	policy.security.onRoot != "Allow"
	linux
	policy.security.seccompFill != null
	object.get(m(object.get(psc, "seccompProfile", {})), "type", null) == null
}

unhardened contains sprintf("%s privileged", [e.c.name]) if {
	policy.security.onRoot != "Allow"
	linux
	some e in containers
	object.get(sc(e.c), "privileged", null) == null
}

unhardened contains sprintf("%s allowPrivilegeEscalation", [e.c.name]) if {
	policy.security.onRoot != "Allow"
	linux
	some e in containers
	context := sc(e.c)
	object.get(context, "allowPrivilegeEscalation", null) == null
	not context.privileged == true
	not "CAP_SYS_ADMIN" in a(object.get(m(object.get(context, "capabilities", {})), "add", []))
}

unhardened contains sprintf("%s drop %s", [e.c.name, cap]) if {
	policy.security.onRoot != "Allow"
	linux
	some e in containers
	some cap in policy.security.dropFill
	not cap in a(object.get(m(object.get(sc(e.c), "capabilities", {})), "drop", []))
}

unapplied contains viol("security.defaults", "spec", sprintf("not applied: security defaults: %s", [concat(", ", unhardened)])) if {
	count(unhardened) > 0
}

# --- the rest of the Pod Security Standards (check_pod_security) ---------------------------

safe_sysctls := {
	"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
	"net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start",
	"net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time",
	"net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
	"net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
}

selinux_types := {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}

restricted_volume_types := {
	"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
	"persistentVolumeClaim", "projected", "secret",
}

check_violation contains viol("security.sysctls", sprintf("spec.securityContext.sysctls[%d].name", [i]), sprintf("sysctl %s is not in the safe set", [s.name])) if {
	some i, s in a(object.get(psc, "sysctls", []))
	not s.name in safe_sysctls
}

contexts contains ["spec.securityContext", psc] if is_object(spec.securityContext)

contexts contains [sprintf("%s.securityContext", [cpath(e)]), sc(e.c)] if {
	some e in all_containers
	is_object(e.c.securityContext)
}

check_violation contains viol("security.apparmor", sprintf("%s.appArmorProfile.type", [path]), "AppArmor profile not allowed") if {
	some [path, context] in contexts
	apparmor := context.appArmorProfile
	apparmor != null
	not object.get(m(apparmor), "type", null) in confined
}

check_violation contains viol("security.selinux", sprintf("%s.seLinuxOptions.type", [path]), "SELinux type not allowed") if {
	some [path, context] in contexts
	options := context.seLinuxOptions
	options != null
	not object.get(m(options), "type", "") in selinux_types
}

check_violation contains viol("security.selinux", sprintf("%s.seLinuxOptions.%s", [path, k]), sprintf("a SELinux %s may not be set", [k])) if {
	some [path, context] in contexts
	some k in ["user", "role"]
	not object.get(m(context.seLinuxOptions), k, "") in {"", null}
}

check_violation contains viol("security.privileged", sprintf("%s.windowsOptions.hostProcess", [path]), "a HostProcess container runs on the host") if {
	some [path, context] in contexts
	context.windowsOptions.hostProcess == true
}

check_violation contains viol("security.apparmor", sprintf("metadata.annotations[%s]", [k]), sprintf("AppArmor profile %q is not allowed", [value])) if {
	some k, value in annotations
	startswith(k, "container.apparmor.security.beta.kubernetes.io/")
	not value in {"", "runtime/default"}
	not startswith(value, "localhost/")
}

check_violation contains viol("security.proc-mount", sprintf("%s.securityContext.procMount", [cpath(e)]), sprintf("procMount %v unmasks /proc", [mount])) if {
	some e in all_containers
	mount := sc(e.c).procMount
	not mount in {null, "Default"}
}

check_violation contains viol("security.host-ports", sprintf("%s.ports[%d].hostPort", [cpath(e), j]), sprintf("hostPort %v binds a port of the node", [port.hostPort])) if {
	some e in all_containers
	some j, port in a(object.get(e.c, "ports", []))
	not object.get(port, "hostPort", 0) in {0, null}
}

probes(c) := [[k, h] |
	some k in ["livenessProbe", "readinessProbe", "startupProbe"]
	h := c[k]
	h != null
]

hooks(c) := [[sprintf("lifecycle.%s", [k]), h] |
	some k in ["postStart", "preStop"]
	h := c.lifecycle[k]
	h != null
]

handlers(c) := array.concat(probes(c), hooks(c))

check_violation contains viol("security.probe-host", sprintf("%s.%s.%s.host", [cpath(e), k, action]), "the kubelet would connect to another machine") if {
	some e in all_containers
	some [k, handler] in handlers(e.c)
	some action in ["httpGet", "tcpSocket"]
	not object.get(m(handler[action]), "host", "") in {"", null}
}

volumes := a(object.get(spec, "volumes", []))

check_violation contains viol("volumes.forbidden-type", sprintf("spec.volumes[%d]", [i]), sprintf("volume %q of type %s is not allowed at level %s", [volume.name, kind, policy.security.level])) if {
	some i, volume in volumes
	some kind, source in volume
	kind != "name"
	source != null
	kind in policy.volumes.allowedTypes
	level_forbids(kind)
}

level_forbids(kind) if kind == "hostPath"

level_forbids(kind) if {
	restricted
	not kind in restricted_volume_types
}

# --- volumes.* ------------------------------------------------------------------------------

check_violation contains viol("volumes.forbidden-type", sprintf("spec.volumes[%d]", [i]), sprintf("volume %q of type %s is not allowed", [volume.name, kind])) if {
	some i, volume in volumes
	some kind, _ in volume
	kind != "name"
	not kind in policy.volumes.allowedTypes
}

claim_data_fields := ["dataSource", "dataSourceRef", "volumeName", "selector"]

preexisting(volume) := sprintf("pvc %s (only runs the platform creates may use it)", [claim]) if {
	claim := volume.persistentVolumeClaim.claimName
	named_any(policy.volumes.platformClaims, claim)
	not owned(policy)
} else := sprintf("pvc %s", [claim]) if {
	# not a platform claim: with no cluster state, never a project-shared one either
	claim := volume.persistentVolumeClaim.claimName
	not named_any(policy.volumes.platformClaims, claim)
} else := sprintf("configMap %s", [name]) if {
	name := volume.configMap.name
	not named_any(policy.volumes.platformConfigMaps, name)
} else := sprintf("configMap %s (only runs the platform creates may use it)", [name]) if {
	name := volume.configMap.name
	not owned(policy)
} else := "claim template with existing data" if {
	template := m(volume.ephemeral.volumeClaimTemplate.spec)
	some f in claim_data_fields
	not object.get(template, f, null) in {null, {}, ""}
}

check_violation contains viol("volumes.pre-existing", sprintf("spec.volumes[%d]", [i]), sprintf("volume %q uses pre-existing %s", [volume.name, what])) if {
	some i, volume in volumes
	what := preexisting(volume)
}

check_violation contains viol("volumes.pre-existing", sprintf("spec.volumes[%d].projected.sources[%d].configMap", [i, j]), sprintf("volume %q projects pre-existing configMap %s", [volume.name, name])) if {
	some i, volume in volumes
	some j, source in a(object.get(m(volume.projected), "sources", []))
	name := source.configMap.name
	name != "kube-root-ca.crt"
	not platform_config_map(name)
}

platform_config_map(name) if {
	named_any(policy.volumes.platformConfigMaps, name)
	owned(policy)
}

# --- secrets.forbidden ----------------------------------------------------------------------

secret_refs contains [name, sprintf("%s.env[%d].valueFrom.secretKeyRef", [cpath(e), j])] if {
	some e in all_containers
	some j, env in a(object.get(e.c, "env", []))
	name := env.valueFrom.secretKeyRef.name
}

secret_refs contains [name, sprintf("%s.envFrom[%d].secretRef", [cpath(e), j])] if {
	some e in all_containers
	some j, source in a(object.get(e.c, "envFrom", []))
	name := source.secretRef.name
}

secret_refs contains [volume.secret.secretName, sprintf("spec.volumes[%d].secret", [i])] if {
	some i, volume in volumes
}

secret_refs contains [source.secret.name, sprintf("spec.volumes[%d].projected.sources[%d]", [i, j])] if {
	some i, volume in volumes
	some j, source in a(object.get(m(volume.projected), "sources", []))
}

secret_refs contains [ref.name, sprintf("spec.imagePullSecrets[%d]", [i])] if {
	some i, ref in a(object.get(spec, "imagePullSecrets", []))
	not object.get(ref, "name", "") in {"", null}
}

check_violation contains viol("secrets.forbidden", path, sprintf("secret %q is not managed by the platform, or this run is not the platform's", [name])) if {
	some [name, path] in secret_refs
	not secret_allowed(name)
}

secret_allowed(name) if {
	owned(policy)
	named_any(policy.secrets.allowed, name)
}

# --- scheduling.* ---------------------------------------------------------------------------

check_violation contains viol("scheduling.priority-class", "spec.priorityClassName", sprintf("priority class %q is not allowed", [class])) if {
	allowed := policy.scheduling.allowedPriorityClasses
	allowed != null
	class := spec.priorityClassName
	class != null
	not class in allowed
}

unapplied contains viol("scheduling.priority-class", "spec.priorityClassName", "not applied: the default priority class") if {
	policy.scheduling.defaultPriorityClass != null
	class := object.get(spec, "priorityClassName", null)
	not class_allowed(class)
}

class_allowed(class) if {
	class != null
	policy.scheduling.allowedPriorityClasses == null
}

class_allowed(class) if {
	class != null
	class in policy.scheduling.allowedPriorityClasses
}

preemption_key := k if {
	preemption := policy.scheduling.preemption
	is_object(preemption)
	k := object.get(preemption, "annotation", "")
}

stated_mode := annotations[preemption_key] if {
	annotations[preemption_key] != ""
} else := labels[preemption_key] if {
	labels[preemption_key] != ""
}

check_violation contains viol("scheduling.preemption-mode", "metadata", sprintf("preemption mode %q is not one of allow, constrain, prevent, none", [stated_mode])) if {
	is_string(stated_mode)
	not stated_mode in {"allow", "constrain", "prevent", "none"}
}

# --- ownership.* ----------------------------------------------------------------------------

# References to objects with a platform name, whatever the run (placeholders match any value).
platform_refs(p) := {[kind, name, path] |
	some [kind, name, path] in references
	is_string(name)
	some rx in p.anyNames[kind]
	regex.match(rx, name)
}

references contains ["PersistentVolumeClaim", volume.persistentVolumeClaim.claimName, sprintf("spec.volumes[%d]", [i])] if {
	some i, volume in volumes
}

references contains ["ConfigMap", volume.configMap.name, sprintf("spec.volumes[%d]", [i])] if {
	some i, volume in volumes
}

references contains ["ConfigMap", source.configMap.name, sprintf("spec.volumes[%d].projected.sources[%d]", [i, j])] if {
	some i, volume in volumes
	some j, source in a(object.get(m(volume.projected), "sources", []))
}

references contains ["ConfigMap", env.valueFrom.configMapKeyRef.name, sprintf("%s.env[%d]", [cpath(e), j])] if {
	some e in all_containers
	some j, env in a(object.get(e.c, "env", []))
}

references contains ["ConfigMap", source.configMapRef.name, sprintf("%s.envFrom[%d]", [cpath(e), j])] if {
	some e in all_containers
	some j, source in a(object.get(e.c, "envFrom", []))
}

references contains ["Secret", name, path] if {
	some [name, path] in secret_refs
}

check_violation contains viol("ownership.unknown", "metadata.ownerReferences", "no cluster state to find the owner: cannot tell whether the platform created this run") if {
	ownership_unknown(policy)
	count(platform_refs(policy)) > 0
}

outside_violation contains viol("ownership.not-a-run", path, sprintf("%s %q is the platform's and this is not a platform run", [kind, name])) if {
	not is_run
	p := policies[0]
	count(p.platform.identities) > 0
	not namespace in p.excludeNamespaces
	not identity(p)
	some [kind, name, path] in platform_refs(p)
}

# --- a Pod that bypassed /mutate (runguard's _not_mutated) ---------------------------------

# What the mutating webhook would still change is a violation under its own rule id, unless
# a check already reported a violation of that concern (security, resources...).
concern(rule) := split(rule, ".")[0]

reported := {concern(x.rule) | some x in check_violation}

run_violation contains x if some x in check_violation

run_violation contains x if {
	some x in unapplied
	not concern(x.rule) in reported
}

# --- the answer -----------------------------------------------------------------------------

violations := run_violation if {
	judged
	is_run
} else := outside_violation if {
	judged
} else := set()

enforcement := policy.enforcement if {
	is_run
} else := policies[0].enforcement

allowed if count(violations) == 0

allowed if enforcement != "Deny"

message := sprintf("OPA denied Pod %v: %d violation(s): %s", [
	object.get(meta, "name", ""), count(violations),
	concat("; ", [sprintf("[%s] %s: %s", [x.rule, x.path, x.msg]) | some x in violations]),
])

rule_ids := concat(",", {x.rule | some x in violations})

response := {"uid": req.uid, "allowed": true} if {
	count(violations) == 0
} else := {"uid": req.uid, "allowed": true, "auditAnnotations": {"violations": rule_ids}} if {
	allowed
} else := {
	"uid": req.uid,
	"allowed": false,
	"auditAnnotations": {"violations": rule_ids},
	"status": {"code": 403, "reason": "Forbidden", "message": message},
}
