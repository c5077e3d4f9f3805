// Builds oliver006/redis_exporter of one pinned release: the Valkey metrics sidecar's exporter,
// packed into the image docker.io/oliver006/redis_exporter:<version> of the real nodes.
module valkey-operator.local/hack/cluster-build/redis_exporter

go 1.26.0

tool github.com/oliver006/redis_exporter

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/gomodule/redigo v1.9.3 // indirect
	github.com/klauspost/compress v1.18.0 // indirect
	github.com/mna/redisc v1.4.0 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/oliver006/redis_exporter v1.88.0 // indirect
	github.com/prometheus/client_golang v1.23.2 // indirect
	github.com/prometheus/client_model v0.6.2 // indirect
	github.com/prometheus/common v0.66.1 // indirect
	github.com/prometheus/procfs v0.16.1 // indirect
	github.com/sirupsen/logrus v1.9.4 // indirect
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	golang.org/x/crypto v0.54.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	google.golang.org/protobuf v1.36.8 // indirect
)
