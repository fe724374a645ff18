package metrics

import "github.com/prometheus/client_golang/prometheus"

// Planner holds the router's planner series (docs/metrics.md, "Planner"):
//
//   - pdserve_planner_desired_replicas{role} (gauge, workers): the counts
//     the planner last decided on, the target of an HPA or KEDA scaling on it;
//   - pdserve_planner_replicas{role} (gauge, workers): the workers taking
//     requests at its last decision;
//   - pdserve_planner_needed_workers{role} (gauge, workers, fractional):
//     the need it estimated for the SLOs (0 while not measured);
//   - pdserve_planner_arrival_rate (gauge, requests/s): arrivals over its
//     window, shed ones included;
//   - pdserve_planner_within_slos_ratio (gauge, ratio): the window's
//     finished requests within both SLOs;
//   - pdserve_planner_decisions_total{action} (counter): decisions by
//     action (hold, flip, scale);
//   - pdserve_planner_actions_total{action,result} (counter): changes its
//     actuator made, by result (ok, failed).
type Planner struct {
	desired, replicas, need *prometheus.GaugeVec
	arrivals, within        prometheus.Gauge
	decisions, actions      *prometheus.CounterVec
}

// plannerRoles are the roles of the planner's series, in the order of
// Decided's arrays.
var plannerRoles = []string{"prefill", "decode"}

// NewPlanner registers the planner's collectors on reg.
func NewPlanner(reg prometheus.Registerer) (*Planner, error) {
	m := &Planner{
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
	for _, a := range []string{"hold", "flip", "scale"} {
		m.decisions.WithLabelValues(a)
	}
	return m, nil
}

// Decided records one decision: its action, the counts decided on
// (desired, by role prefill then decode), those taking requests, the
// estimated need, the arrival rate and the fraction within the SLOs.
func (m *Planner) Decided(action string, desired, replicas [2]int, need [2]float64, arrivalRate, withinSLOs float64) {
	for i, role := range plannerRoles {
		m.desired.WithLabelValues(role).Set(float64(desired[i]))
		m.replicas.WithLabelValues(role).Set(float64(replicas[i]))
		m.need.WithLabelValues(role).Set(need[i])
	}
	m.arrivals.Set(arrivalRate)
	m.within.Set(withinSLOs)
	m.decisions.WithLabelValues(action).Inc()
}

// Acted records a change the actuator made (result "ok" or "failed").
func (m *Planner) Acted(action, result string) { m.actions.WithLabelValues(action, result).Inc() }
