package live

import (
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/outbox"
)

// collector exports gauges read from the same snapshot the dashboard shows:
// a scrape never runs a query of its own.
type collector struct {
	f *Feed
	// seen are the topics this process has reported a backlog for (or seen
	// paused): once drained they report 0 instead of vanishing, so a graph
	// or an alert on sluice_outbox_backlog{topic} sees the drain, not a gap.
	// Bounded by the topics operators create.
	mu   sync.Mutex
	seen map[string]bool

	backlog, oldest, dead, held, unknown, reconcile, stuck, discrepancies, clients *prometheus.Desc
	approvals                                                                      *prometheus.Desc
	jobs, paused, heldPartial, relays, relaysDisagree                              *prometheus.Desc
	consumerProcesses, consumerProblems, relaysFailing                             *prometheus.Desc
	age                                                                            *prometheus.Desc
}

// StaleAfter is how old the latest snapshot may be, its database not
// answering, before /metrics leaves its gauges out: a scrape then finds
// them absent rather than the last figures read, frozen (an alert on the
// oldest pending event's age could not fire through an outage). A failed
// read or two (a restart, a slow statement) leaves them in.
const StaleAfter = 15 * time.Second

// Register adds the feed's gauges to reg.
func (f *Feed) Register(reg prometheus.Registerer) error {
	return reg.Register(&collector{
		f:       f,
		seen:    map[string]bool{},
		backlog: prometheus.NewDesc("sluice_outbox_backlog", "Pending outbox events per topic.", []string{"topic"}, nil),
		oldest:  prometheus.NewDesc("sluice_outbox_oldest_pending_age_seconds", "Age of the oldest pending outbox event.", nil, nil),
		dead:    prometheus.NewDesc("sluice_outbox_dead_letter", "Dead-lettered outbox events.", nil, nil),
		held: prometheus.NewDesc("sluice_outbox_held",
			"Pending outbox events held behind a dead letter of their aggregate (ordering on); a lower bound when sluice_outbox_held_partial is 1.", nil, nil),
		heldPartial: prometheus.NewDesc("sluice_outbox_held_partial",
			fmt.Sprintf("1 when sluice_outbox_held is a lower bound: more than %d aggregates hold dead letters, or more events are held than one read counts (%d in all).",
				outbox.HeldAggregatesCounted, outbox.HeldEventsCounted), nil, nil),
		unknown:   prometheus.NewDesc("sluice_payments_unknown", "Payments whose outcome is unknown.", nil, nil),
		reconcile: prometheus.NewDesc("sluice_payments_reconcile_age_seconds", "Age of the oldest unknown payment.", nil, nil),
		stuck:     prometheus.NewDesc("sluice_idempotency_stuck_processing", "Processing idempotency records whose lease expired.", nil, nil),
		clients:   prometheus.NewDesc("sluice_ws_clients", "Connected dashboard websockets.", nil, nil),
		discrepancies: prometheus.NewDesc("sluice_payments_discrepancies",
			"Open payment discrepancies: provider evidence contradicts our record.", nil, nil),
		approvals: prometheus.NewDesc("sluice_payments_approvals_pending",
			"Four-eyes resolutions of unknown payments waiting for a second operator.", nil, nil),
		jobs: prometheus.NewDesc("sluice_console_bulk_jobs",
			"Unfinished bulk jobs by state (pending: waiting for a runner; running: claimed).", []string{"state"}, nil),
		relays: prometheus.NewDesc("sluice_outbox_relays",
			"Relays by what their reports in outbox_relay say: running; paused on a broker outage (they probe and resume by themselves); silent (stopped reporting without signing off, in the last hour: killed, host lost, cut off from the database).",
			[]string{"state"}, nil),
		relaysDisagree: prometheus.NewDesc("sluice_outbox_relays_disagree",
			"1 when running relays publish differently (OUTBOX_SHARDS or RELAY_ORDERING): consumers miss or reorder events.", nil, nil),
		relaysFailing: prometheus.NewDesc("sluice_outbox_relays_failing",
			"Running relays whose last failed publish is newer than their last publish (not an outage: they would be paused).", nil, nil),
		consumerProcesses: prometheus.NewDesc("sluice_inbox_consumer_processes",
			"Consumer processes by what their reports in inbox_consumer_process say: running; silent (stopped reporting without signing off, in the last hour).",
			[]string{"state"}, nil),
		consumerProblems: prometheus.NewDesc("sluice_inbox_consumer_problems",
			"What the consumer processes leave unread, as the inbox page lists it: consumers none of whose processes runs, processes reading a shard count the relays do not publish on or several counts, shards no running process may read.",
			nil, nil),
		age: prometheus.NewDesc("sluice_console_snapshot_age_seconds",
			fmt.Sprintf("Seconds since this console last read its snapshot (every tick while the database answers); past %s the snapshot's gauges are left out.", StaleAfter),
			nil, nil),
		paused: prometheus.NewDesc("sluice_outbox_topic_paused",
			"1 for each topic an operator paused (relays do not publish it until it is resumed).", []string{"topic"}, nil),
	})
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.backlog, c.oldest, c.dead, c.held, c.unknown, c.reconcile, c.stuck, c.discrepancies, c.approvals, c.clients, c.jobs, c.paused, c.heldPartial, c.relays, c.relaysDisagree, c.relaysFailing, c.consumerProcesses, c.consumerProblems, c.age} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.clients, prometheus.GaugeValue, float64(c.f.Clients()))
	// The age is always there, before the first snapshot too (since the
	// feed started): a console started while its database does not answer
	// has it to alert on.
	age, _ := c.f.Age()
	ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, age.Seconds())
	s, ok := c.f.Latest()
	if !ok || age > c.f.staleAfter() {
		return
	}
	c.mu.Lock()
	now := make(map[string]bool, len(s.Backlog))
	for _, b := range s.Backlog {
		ch <- prometheus.MustNewConstMetric(c.backlog, prometheus.GaugeValue, float64(b.Pending), b.Topic)
		now[b.Topic], c.seen[b.Topic] = true, true
	}
	for _, p := range s.Paused {
		ch <- prometheus.MustNewConstMetric(c.paused, prometheus.GaugeValue, 1, p.Topic)
		c.seen[p.Topic] = true
	}
	for topic := range c.seen {
		if !now[topic] {
			ch <- prometheus.MustNewConstMetric(c.backlog, prometheus.GaugeValue, 0, topic)
		}
	}
	c.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, s.OldestPendingAge.Seconds())
	ch <- prometheus.MustNewConstMetric(c.dead, prometheus.GaugeValue, float64(s.Dead))
	ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, float64(s.Held.Events))
	ch <- prometheus.MustNewConstMetric(c.heldPartial, prometheus.GaugeValue, b2f(s.Held.Partial))
	ch <- prometheus.MustNewConstMetric(c.unknown, prometheus.GaugeValue, float64(s.Unknown))
	ch <- prometheus.MustNewConstMetric(c.reconcile, prometheus.GaugeValue, s.ReconcileAge.Seconds())
	ch <- prometheus.MustNewConstMetric(c.stuck, prometheus.GaugeValue, float64(s.StuckProcessing))
	ch <- prometheus.MustNewConstMetric(c.discrepancies, prometheus.GaugeValue, float64(s.Discrepancies))
	ch <- prometheus.MustNewConstMetric(c.approvals, prometheus.GaugeValue, float64(s.Approvals.Pending))
	// Only the unfinished states: the snapshot reads unfinished jobs through
	// their partial index; finished ones are history, not a current level.
	var pending, running int
	for _, j := range s.Jobs {
		switch j.State {
		case outbox.JobPending:
			pending++
		case outbox.JobRunning:
			running++
		}
	}
	ch <- prometheus.MustNewConstMetric(c.jobs, prometheus.GaugeValue, float64(pending), outbox.JobPending)
	ch <- prometheus.MustNewConstMetric(c.jobs, prometheus.GaugeValue, float64(running), outbox.JobRunning)
	ch <- prometheus.MustNewConstMetric(c.relays, prometheus.GaugeValue, float64(s.Relays.Running), "running")
	ch <- prometheus.MustNewConstMetric(c.relays, prometheus.GaugeValue, float64(s.Relays.Paused), "paused")
	ch <- prometheus.MustNewConstMetric(c.relays, prometheus.GaugeValue, float64(s.Relays.Silent), "silent")
	ch <- prometheus.MustNewConstMetric(c.relaysDisagree, prometheus.GaugeValue, b2f(s.Relays.Disagree()))
	ch <- prometheus.MustNewConstMetric(c.relaysFailing, prometheus.GaugeValue, float64(s.Relays.Failing))
	procs, silentProcs := s.ConsumerProcesses()
	ch <- prometheus.MustNewConstMetric(c.consumerProcesses, prometheus.GaugeValue, float64(procs), "running")
	ch <- prometheus.MustNewConstMetric(c.consumerProcesses, prometheus.GaugeValue, float64(silentProcs), "silent")
	ch <- prometheus.MustNewConstMetric(c.consumerProblems, prometheus.GaugeValue, float64(len(s.ConsumerProblems())))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
