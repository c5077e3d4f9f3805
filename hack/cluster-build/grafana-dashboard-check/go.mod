// grafana-dashboard-check (main.go): the shipped Grafana dashboard against Grafana's own schema
// (grafana-foundation-sdk), for the monitoring tests. Grafana's dashboard-linter is not served by
// the Go module proxy.
module valkey-operator.local/hack/cluster-build/grafana-dashboard-check

go 1.26.0

require github.com/grafana/grafana-foundation-sdk/go v0.0.22
