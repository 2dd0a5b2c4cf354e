# OPA as a validating admission webhook: `opa run --server` answers POST / with
# data.system.main, here an admission.k8s.io/v1 AdmissionReview built from runguard.rego.
package system

main := {
	"apiVersion": "admission.k8s.io/v1",
	"kind": "AdmissionReview",
	"response": data.runguard.response,
}
