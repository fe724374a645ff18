package planner

import "github.com/prometheus/client_golang/prometheus"

// plannerMetrics are the planner's series:
//
//	pdserve_planner_desired_replicas{role}  gauge    workers the planner last decided on (the HPA/KEDA target)
//	pdserve_planner_replicas{role}          gauge    workers taking requests at the last decision
//	pdserve_planner_needed_workers{role}    gauge    the estimated need, fractional (Estimate)
//	pdserve_planner_arrival_rate            gauge    requests/s arriving over the window
//	pdserve_planner_within_slos_ratio       gauge    fraction of the window's requests within both SLOs
//	pdserve_planner_decisions_total{action} counter  decisions (hold, flip, scale)
//	pdserve_planner_actions_total{action,result} counter changes applied (result ok, failed)
type plannerMetrics struct {
	desired, replicas, need *prometheus.GaugeVec
	arrivals, within        prometheus.Gauge
	decisions               *prometheus.CounterVec
	actions                 *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*plannerMetrics, error) {
	m := &plannerMetrics{
		desired: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pdserve_planner_desired_replicas",
			Help: "Workers of the role the planner last decided on: the target of an HPA or KEDA scaling on it."}, []string{"role"}),
		replicas: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pdserve_planner_replicas",
			Help: "Workers of the role taking requests at the planner's last decision."}, []string{"role"}),
		need: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pdserve_planner_needed_workers",
			Help: "Workers of the role the measured load needs to meet the SLOs (fractional; 0 while not measured)."}, []string{"role"}),
		arrivals: prometheus.NewGauge(prometheus.GaugeOpts{Name: "pdserve_planner_arrival_rate",
			Help: "Requests per second reaching the router over the planner's window (shed ones included)."}),
		within: prometheus.NewGauge(prometheus.GaugeOpts{Name: "pdserve_planner_within_slos_ratio",
			Help: "Fraction of the requests that ended in the planner's window within both the TTFT and the ITL SLO."}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pdserve_planner_decisions_total",
			Help: "Planner decisions, by action (hold, flip, scale)."}, []string{"action"}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pdserve_planner_actions_total",
			Help: "Changes the planner's actuator made, by action (flip, scale) and result (ok, failed)."}, []string{"action", "result"}),
	}
	for _, c := range []prometheus.Collector{m.desired, m.replicas, m.need, m.arrivals, m.within, m.decisions, m.actions} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// observe sets the gauges from d; target is the counts last decided.
func (m *plannerMetrics) observe(d Decision, target [2]int) {
	m.desired.WithLabelValues(rolePrefill).Set(float64(target[0]))
	m.desired.WithLabelValues(roleDecode).Set(float64(target[1]))
	m.replicas.WithLabelValues(rolePrefill).Set(float64(d.Prefill))
	m.replicas.WithLabelValues(roleDecode).Set(float64(d.Decode))
	m.need.WithLabelValues(rolePrefill).Set(d.Need.Prefill)
	m.need.WithLabelValues(roleDecode).Set(d.Need.Decode)
	m.arrivals.Set(d.Inputs.ArrivalRate)
	m.within.Set(d.Inputs.WithinSLOs)
	m.decisions.WithLabelValues(d.Action).Inc()
}
