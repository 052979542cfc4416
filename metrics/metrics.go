// Package metrics exports torpor's figures in Prometheus form: sandboxes
// by state, transitions by kind and cause with their latency, hook runs,
// scheduler lag, store write latency, node capacity, and HTTP requests.
package metrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/lifecycle"
)

// Metrics holds the collectors of one daemon. It is a lifecycle.Observer.
type Metrics struct {
	reg         *prometheus.Registry
	transitions *prometheus.CounterVec
	latency     *prometheus.HistogramVec
	hooks       *prometheus.CounterVec
	sweepLag    prometheus.Histogram
	storeWrite  prometheus.Histogram
	usageRows   prometheus.Counter
	proxyReqs   *prometheus.CounterVec
	proxyOK     prometheus.Counter // proxyReqs{result="ok"}, the common case
	proxyWakes  *prometheus.CounterVec
	proxyWake   prometheus.Histogram
	requests    *prometheus.CounterVec
	reqLatency  *prometheus.HistogramVec
}

// Source is what the gauges read on each scrape (the engine).
type Source interface {
	StateCounts() map[torpor.State]int
	CapacityUsed() (vcpus, memoryMiB float64, capacity lifecycle.Capacity)
}

// New registers every collector but the gauges of a Source (AddSource).
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.transitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "torpor_transitions_total", Help: "Completed transitions by kind (create, pause, resume, hibernate, start, restart, terminate, fail, auto_resume_wait) and cause.",
	}, []string{"kind", "cause"})
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "torpor_transition_seconds", Help: "How long transitions took, by kind.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"kind"})
	m.hooks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "torpor_hook_runs_total", Help: "Lifecycle hook runs by transition and result (ok, failed).",
	}, []string{"on", "result"})
	m.sweepLag = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "torpor_scheduler_lag_seconds", Help: "How late the idle engine acted on a deadline.",
		Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 30},
	})
	m.storeWrite = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "torpor_store_write_seconds", Help: "Latency of durable sandbox writes to the store.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .5},
	})
	m.usageRows = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "torpor_usage_ledger_rows_total", Help: "Rows written to the usage ledger.",
	})
	m.proxyReqs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "torpor_proxy_requests_total", Help: "Requests through the port proxy by result (ok, tunnel, or the error code).",
	}, []string{"result"})
	m.proxyOK = m.proxyReqs.WithLabelValues("ok")
	m.proxyWakes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "torpor_proxy_wakeups_total", Help: "Proxy requests that had to wake their sandbox, by result.",
	}, []string{"result"})
	m.proxyWake = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "torpor_proxy_wake_seconds", Help: "How long a proxy request waited for its sandbox to wake.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .5, 1, 5, 30},
	})
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "torpor_http_requests_total", Help: "API requests by route and status code.",
	}, []string{"route", "code"})
	m.reqLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "torpor_http_request_seconds", Help: "API request latency by route.",
		Buckets: prometheus.DefBuckets,
	}, []string{"route"})
	m.reg.MustRegister(m.transitions, m.latency, m.hooks, m.sweepLag, m.storeWrite, m.usageRows, m.proxyReqs, m.proxyWakes, m.proxyWake, m.requests, m.reqLatency,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// AddSource registers the gauges that read src on each scrape: sandboxes
// by state and what they hold of the node. The source is the engine, which
// is made after the metrics because it reports to them as its Observer;
// call AddSource once it exists, before the metrics are served. A second
// source panics (its gauges would collide).
func (m *Metrics) AddSource(src Source) { m.reg.MustRegister(newSandboxCollector(src)) }

// Handler serves the metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Transition implements lifecycle.Observer.
func (m *Metrics) Transition(kind, cause string, took time.Duration) {
	m.transitions.WithLabelValues(kind, cause).Inc()
	if kind != "fail" {
		m.latency.WithLabelValues(kind).Observe(took.Seconds())
	}
}

// HookRan implements lifecycle.Observer.
func (m *Metrics) HookRan(on string, failed bool) {
	result := "ok"
	if failed {
		result = "failed"
	}
	m.hooks.WithLabelValues(on, result).Inc()
}

// SweepLag implements lifecycle.Observer.
func (m *Metrics) SweepLag(lag time.Duration) { m.sweepLag.Observe(max(lag, 0).Seconds()) }

// StoreWrite implements lifecycle.Observer.
func (m *Metrics) StoreWrite(took time.Duration) { m.storeWrite.Observe(took.Seconds()) }

// UsageRows implements lifecycle.Observer.
func (m *Metrics) UsageRows(n int) { m.usageRows.Add(float64(n)) }

// ProxyRequest implements proxy.Observer.
func (m *Metrics) ProxyRequest(result string) {
	if result == "ok" {
		m.proxyOK.Inc()
		return
	}
	m.proxyReqs.WithLabelValues(result).Inc()
}

// ProxyWake implements proxy.Observer.
func (m *Metrics) ProxyWake(took time.Duration, ok bool) {
	result := "ok"
	if !ok {
		result = "error"
	}
	m.proxyWakes.WithLabelValues(result).Inc()
	m.proxyWake.Observe(took.Seconds())
}

// Request records one API request (route is the pattern, never the raw
// path, so ids do not blow up the label set).
func (m *Metrics) Request(route string, status int, took time.Duration) {
	m.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
	m.reqLatency.WithLabelValues(route).Observe(took.Seconds())
}

// sandboxCollector reads the engine's state counts and capacity on scrape.
type sandboxCollector struct {
	src                     Source
	byState, capUsed, capOf *prometheus.Desc
}

func newSandboxCollector(src Source) *sandboxCollector {
	return &sandboxCollector{
		src:     src,
		byState: prometheus.NewDesc("torpor_sandboxes", "Sandboxes by state (terminated ones are not counted).", []string{"state"}, nil),
		capUsed: prometheus.NewDesc("torpor_capacity_used", "What running and paused sandboxes hold of the node, by resource (vcpus, memory_mib).", []string{"resource"}, nil),
		capOf:   prometheus.NewDesc("torpor_capacity", "What the node lends, by resource (0: unlimited).", []string{"resource"}, nil),
	}
}

func (c *sandboxCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.byState
	ch <- c.capUsed
	ch <- c.capOf
}

func (c *sandboxCollector) Collect(ch chan<- prometheus.Metric) {
	counts := c.src.StateCounts()
	for _, s := range torpor.AllStates {
		if s == torpor.StateTerminated {
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.byState, prometheus.GaugeValue, float64(counts[s]), string(s))
	}
	v, mem, capacity := c.src.CapacityUsed()
	ch <- prometheus.MustNewConstMetric(c.capUsed, prometheus.GaugeValue, v, "vcpus")
	ch <- prometheus.MustNewConstMetric(c.capUsed, prometheus.GaugeValue, mem, "memory_mib")
	ch <- prometheus.MustNewConstMetric(c.capOf, prometheus.GaugeValue, capacity.VCPUs, "vcpus")
	ch <- prometheus.MustNewConstMetric(c.capOf, prometheus.GaugeValue, float64(capacity.MemoryMiB), "memory_mib")
}

var _ lifecycle.Observer = (*Metrics)(nil)
