module curia.dev/services/reconciler

go 1.26.0

require pgregory.net/rapid v1.3.0

replace (
	curia.dev/gen => ../../gen
	curia.dev/platform => ../../platform
)
