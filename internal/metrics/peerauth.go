package metrics

import "github.com/prometheus/client_golang/prometheus"

// Channels of pdserve_peer_auth_failures_total.
const (
	// ChannelKV: the KV channel's handshakes (reasons: version,
	// fingerprint, auth_mode, bad_proof, tls, malformed, timeout,
	// peer_refused; see package kvxfer/tcp).
	ChannelKV = "kv"
	// ChannelWorkerAPI: requests to the worker API (reasons: missing,
	// malformed, bad_signature, stale, replayed, bad_digest, too_large,
	// nonce_cache, no_client_cert, bad_certificate; see package auth).
	ChannelWorkerAPI = "worker_api"
)

// PeerAuthSnapshot returns the refusals so far, by channel and reason;
// every reason a channel has, zeros included, so every series exists from
// the first scrape. It is called on every scrape.
type PeerAuthSnapshot func() map[string]map[string]uint64

var peerAuthDesc = prometheus.NewDesc("pdserve_peer_auth_failures_total",
	"Connections (kv) and requests (worker_api) a worker refused because the peer did not prove it belongs to the fleet, or failed its handshake, by reason.",
	[]string{"role", "channel", "reason"}, nil)

// NewPeerAuth registers on reg the worker's
// pdserve_peer_auth_failures_total{role,channel,reason} (counter), read at
// scrape time from snap. It returns an error if it is already registered.
func NewPeerAuth(reg prometheus.Registerer, role string, snap PeerAuthSnapshot) error {
	return reg.Register(&peerAuthCollector{role: role, snap: snap})
}

type peerAuthCollector struct {
	role string
	snap PeerAuthSnapshot
}

func (c *peerAuthCollector) Describe(ch chan<- *prometheus.Desc) { ch <- peerAuthDesc }

func (c *peerAuthCollector) Collect(ch chan<- prometheus.Metric) {
	for channel, reasons := range c.snap() {
		for reason, n := range reasons {
			ch <- prometheus.MustNewConstMetric(peerAuthDesc, prometheus.CounterValue, float64(n), c.role, channel, reason)
		}
	}
}
